//! `bmoe inspect`: the header's facts, and on request how `--rpc` would split
//! the model and what decode rate to expect on this host (`--forecast`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;

use super::usage::UsageError;
use bmoe::engine::RpcLayers;
use bmoe::forecast::{self, CacheOutcome, HostFacts};
use bmoe::layout::MoeLayout;
use bmoe::stream::route_from::{ForcedRoutes, RunShape};
use bmoe_flash::cache::CachePolicy;
use bmoe_trace::replay;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The gguf file.
    pub model: PathBuf,
    /// Also say how `--rpc --rpc-layers N` would split it: what the RPC
    /// hosts hold, what stays and streams here, the network per token;
    /// auto: how many layers each amount of free memory on the hosts takes.
    #[arg(long, value_name = "N|auto")]
    pub rpc_layers: Option<RpcLayers>,
    /// Also forecast the decode rate on this host at cache 0, 10%, 25%, 50%
    /// and auto: probes the read bandwidth of this file's expert slices and
    /// ggml's product kernel, then streams a few tokens of the model at cache
    /// 0 to measure its compute and reads (seconds; see --probe-tokens).
    #[arg(long)]
    pub forecast: bool,
    /// With --forecast: hit rates from this route trace of the model
    /// (`bmoe run --route-trace`) replayed under the default policy, instead
    /// of the published real routing of docs/cache.md.
    #[arg(long, value_name = "FILE", requires = "forecast")]
    pub route_trace: Option<PathBuf>,
    /// With --route-trace: replay the trace as `bmoe run --route-from` hands
    /// it to a run of PROMPT prompt tokens and TOKENS generated, from a cold
    /// cache (the hit rate over that run's generated tokens), instead of the
    /// trace's own decodes (a long run's).
    #[arg(long, value_name = "PROMPT,TOKENS", value_parser = parse_run_shape, requires = "route_trace")]
    pub forced_run: Option<RunShape>,
    /// With --forecast: seconds the read probe runs.
    #[arg(long, value_name = "S", default_value_t = 2.0, requires = "forecast")]
    pub probe_seconds: f64,
    /// With --forecast: tokens the decode probe generates (the model streamed
    /// at cache 0; its compute outside flash waits and its own read rate
    /// replace the kernel model and the read probe). 0: no decode probe.
    #[arg(long, value_name = "N", default_value_t = 8, requires = "forecast")]
    pub probe_tokens: u32,
    /// With --forecast: where the compute term comes from. decode: the decode
    /// probe (above), or the kernel model without it; depth: resident decodes
    /// of the model cut to its first blocks (--depth-blocks; copies written to
    /// the temp directory and removed after), 32 tokens each, fitted as fixed +
    /// per block and scaled to the full depth (the decode probe then gives the
    /// read rate only).
    #[arg(long, value_enum, value_name = "decode|depth", default_value_t = ComputeProbe::Decode, requires = "forecast")]
    pub compute_probe: ComputeProbe,
    /// With --compute-probe depth: the depths (blocks) to cut the model to, at
    /// least two.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', default_value = "2,4", value_parser = clap::value_parser!(u32).range(1..), requires = "forecast")]
    pub depth_blocks: Vec<u32>,
    /// With --compute-probe depth: compute threads of its decodes (default: all cores).
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..=256), requires = "forecast")]
    pub threads: Option<u32>,
}

/// `--compute-probe`: where the forecast's compute term comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeProbe {
    /// The decode probe's compute (streamed at cache 0), else the kernel model.
    Decode,
    /// Resident decodes of the model cut to fewer blocks, scaled to full depth.
    Depth,
}

/// `bmoe inspect MODEL [--rpc-layers N] [--forecast [--route-trace FILE]]`.
pub fn inspect(args: InspectArgs) -> Result<()> {
    let model = &args.model;
    let layout = MoeLayout::open(model).with_context(|| format!("inspect {}", model.display()))?;
    out!("{}", bmoe::inspect::report(model, &layout));
    if args.rpc_layers == Some(RpcLayers::Auto) {
        out!("{}", bmoe::inspect::rpc_auto(&layout));
    }
    if let Some(RpcLayers::Count(n)) = args.rpc_layers {
        if n > layout.blocks() {
            return Err(UsageError(format!(
                "--rpc-layers {n}: the model has {} layers (blocks)",
                layout.blocks()
            ))
            .into());
        }
        out!("{}", bmoe::inspect::rpc_split(&layout, n));
    }
    if args.forecast {
        out!("{}", forecast_table(&args, &layout)?);
    }
    Ok(())
}

/// Measure this host, then the forecast's table.
fn forecast_table(args: &InspectArgs, l: &MoeLayout) -> Result<String> {
    if !l.is_moe() {
        return Err(UsageError(format!(
            "{}: no experts to forecast streaming for",
            args.model.display()
        ))
        .into());
    }
    if !(args.probe_seconds > 0.0 && args.probe_seconds <= 600.0) {
        return Err(UsageError("--probe-seconds: give 0 < S <= 600".into()).into());
    }
    // Every input is checked before the probe spends its seconds.
    let curve = match &args.route_trace {
        Some(p) => Curve::Trace(load_trace(p, &args.model, l, args.forced_run)?),
        None => Curve::Published,
    };
    if args.probe_tokens > MAX_PROBE_TOKENS {
        return Err(UsageError(format!(
            "--probe-tokens: give 0..={MAX_PROBE_TOKENS} (0: no decode probe)"
        ))
        .into());
    }
    let depths = match args.compute_probe {
        ComputeProbe::Depth => Some(depth_blocks(&args.depth_blocks, l)?),
        ComputeProbe::Decode => None,
    };
    let mut host = measure_host(l, Duration::from_secs_f64(args.probe_seconds))?;
    if args.probe_tokens > 0 {
        host.decode = Some(decode_probe(&args.model, l, args.probe_tokens)?);
    }
    let depth = match depths {
        Some(d) => Some(depth_probe(
            &args.model,
            l,
            &d,
            DEPTH_PROBE_TOKENS,
            args.threads,
        )?),
        None => None,
    };
    let depth_used = depth.as_ref().filter(|d| d.usable());
    host.depth_compute_s = depth_used.map(forecast::DepthFit::compute_s);
    let experts = l.expert_bytes();
    let mut cells = Vec::new();
    for (label, share) in [("0", 0.0), ("10%", 0.10), ("25%", 0.25), ("50%", 0.50)] {
        let budget = (experts as f64 * share) as u64;
        cells.push(forecast::cell(
            label,
            budget,
            curve.outcome(share),
            l,
            &host,
        ));
    }
    let auto = forecast::auto_budget_bytes(l, host.mem_available_bytes);
    let share = auto as f64 / experts.max(1) as f64;
    cells.push(forecast::cell("auto", auto, curve.outcome(share), l, &host));
    Ok(forecast::table_with(
        &cells,
        l,
        &host,
        &curve.describe(args.route_trace.as_deref(), args.forced_run),
        depth.as_ref(),
    ))
}

/// Tokens each cut model decodes. A cut model decodes fast (resident, a few
/// blocks), and the slope is extrapolated 10x or more: on E8K2 at 2 and 4
/// blocks, 8 tokens put the full depth at 1.9x a resident run's time, 32
/// tokens within 10% of it.
const DEPTH_PROBE_TOKENS: u32 = 32;

/// `--depth-blocks`, checked against the model: at least two distinct
/// depths, each within its blocks (sorted, deduplicated).
fn depth_blocks(asked: &[u32], l: &MoeLayout) -> Result<Vec<u32>> {
    let mut d = asked.to_vec();
    d.sort_unstable();
    d.dedup();
    if d.len() < 2 || d.iter().any(|&b| b > l.n_layer) {
        return Err(UsageError(format!(
            "--depth-blocks {}: give two or more distinct depths within the model's {} blocks",
            asked
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            l.n_layer
        ))
        .into());
    }
    Ok(d)
}

/// The compute probe: the model cut to each of `depths` blocks (a copy in
/// the temp directory, removed once decoded), a resident decode of `tokens`
/// tokens of each (the copy was just written, so its pages are cached: the
/// time is compute alone), fitted as fixed + per block and scaled to the
/// model's full depth.
fn depth_probe(
    model: &Path,
    l: &MoeLayout,
    depths: &[u32],
    tokens: u32,
    threads: Option<u32>,
) -> Result<forecast::DepthFit> {
    let dir = TempDir::new()?;
    let mut samples = Vec::new();
    for &blocks in depths {
        let cut = dir.0.join(format!("cut-{blocks}.gguf"));
        bmoe::fixture::truncate::truncate_blocks(model, blocks, &cut).with_context(|| {
            format!("compute probe: cut {} to {blocks} blocks", model.display())
        })?;
        let decoded = resident_decode(&cut, l, tokens, threads);
        let _ = std::fs::remove_file(&cut);
        let split = decoded.with_context(|| {
            format!("compute probe: the resident decode of the {blocks}-block cut")
        })?;
        samples.push(forecast::DepthSample {
            blocks,
            tokens: split.tokens,
            token_s: split.compute_s(),
        });
    }
    forecast::DepthFit::of(&samples, l.n_layer)
        .context("compute probe: two distinct depths are needed for a line")
}

/// The compute probe's directory under the temp directory, removed with
/// what is in it when dropped (on an error too).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("bmoe-depth-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("compute probe: create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A resident decode of `tokens` tokens of `model` after a one-word prompt,
/// per token (the decode probe's context).
fn resident_decode(
    model: &Path,
    l: &MoeLayout,
    tokens: u32,
    threads: Option<u32>,
) -> Result<bmoe::engine::DecodeSplit> {
    use bmoe::engine::{Asked, RunConfig};
    let mut cfg = RunConfig::new(model.to_path_buf(), "The".into());
    cfg.n_ctx = probe_ctx(l.n_ctx_train());
    cfg.job.n_predict = tokens + 1;
    cfg.job.ignore_eos = true;
    cfg.mode = Asked::Resident;
    if let Some(t) = threads {
        cfg.threads = t;
    }
    let report = bmoe::engine::run(&cfg, |_| {})?;
    report
        .decode_split()
        .context("the model generated no token to time")
}

/// The longest decode probe (`--probe-tokens`).
const MAX_PROBE_TOKENS: u32 = 64;

/// The decode probe: the model streamed at cache 0 (every routed expert read,
/// so a file bigger than RAM runs too) for `tokens` generated tokens after a
/// one-word prompt; per token, its time outside flash waits and its reads'
/// own rate. Everything else is `bmoe run`'s default, the context included
/// (capped by the training context, which `bmoe run` would refuse to pass): on
/// this project's VM the same reads (the same requests, in the same order) took
/// 15-30% longer at the disk in a process with a 256-token context than with a
/// 2,048-token one (docs/benchmarks.md, "The forecast's decode probe").
fn decode_probe(model: &Path, l: &MoeLayout, tokens: u32) -> Result<forecast::DecodeProbe> {
    use bmoe::engine::{Asked, RunConfig};
    use bmoe::stream::{CacheSize, StreamConfig};
    let mut cfg = RunConfig::new(model.to_path_buf(), "The".into());
    cfg.n_ctx = probe_ctx(l.n_ctx_train());
    cfg.job.n_predict = tokens + 1;
    cfg.job.ignore_eos = true;
    cfg.mode = Asked::StreamMoe(StreamConfig {
        cache: CacheSize::Mib(0),
        ..StreamConfig::default()
    });
    let report = bmoe::engine::run(&cfg, |_| {})
        .context("decode probe (the model streamed at cache 0; --probe-tokens 0 skips it)")?;
    let split = report
        .decode_split()
        .context("decode probe: the model generated no token to time")?;
    Ok(forecast::DecodeProbe {
        tokens: split.tokens,
        compute_s: split.compute_s(),
        read_bytes_per_s: split.read_bytes_per_s(),
    })
}

/// The decode probe's context: `bmoe run`'s default, or the training context
/// where that is shorter (0 or absent: not known, the default).
fn probe_ctx(n_ctx_train: Option<u64>) -> u32 {
    let train = n_ctx_train.filter(|&t| t > 0).unwrap_or(u64::MAX);
    bmoe::engine::DEFAULT_N_CTX.min(u32::try_from(train).unwrap_or(u32::MAX))
}

/// What the fresh-memory read probe reads.
const FRESH_PROBE_BYTES: u64 = 128 << 20;

/// How the forecast's probes read: the engine's default queue depth, O_DIRECT.
const FORECAST_READS: bmoe_flash::ReadSettings = bmoe_flash::ReadSettings {
    queue_depth: 4,
    o_direct: true,
};

/// Read bandwidth of this file's expert slices (depth 4, O_DIRECT) into
/// recycled and into fresh memory, the kernel's rate for the expert type and
/// a graph segment's cost, MemAvailable.
fn measure_host(l: &MoeLayout, probe: Duration) -> Result<HostFacts> {
    use bmoe::llama::matvec;
    use bmoe_flash as flash;
    let (file, slices) = bmoe::stream::probe_slices(l);
    let stop = || bmoe::interrupt::requested().is_some();
    let order = flash::ProbeOrder::Random { seed: 7 };
    let read = flash::probe_read_bandwidth(&file, &slices, FORECAST_READS, probe, order, &stop)
        .with_context(|| format!("read probe of {}", file.display()))?;
    let fresh = flash::probe_fresh_reads(&file, &slices, FORECAST_READS, FRESH_PROBE_BYTES)
        .with_context(|| format!("fresh-memory read probe of {}", file.display()))?;
    let threads = bmoe::llama::default_threads();
    let (ty, n_embd) = (l.experts[0].ggml_type, l.n_embd().unwrap_or(0));
    let kernel = matvec::weight_bytes_per_s(ty, n_embd, threads, Duration::from_millis(500))
        .context("kernel probe")?;
    let segment = matvec::segment_cost(threads).context("segment probe")?;
    Ok(HostFacts {
        read_bytes_per_s: read.bytes_per_s(),
        weight_bytes_per_s: kernel,
        fresh_read_bytes_per_s: fresh.bytes_per_s(),
        segment_s: segment.as_secs_f64(),
        mem_available_bytes: bmoe::stream::memory::mem_available_bytes().unwrap_or(0),
        decode: None,
        depth_compute_s: None,
    })
}

/// Where the hit rates come from.
enum Curve {
    Trace((bmoe_trace::route_trace::TraceHeader, replay::Demands)),
    Published,
}

impl Curve {
    /// The cache's outcome over generated tokens at budget share `share`
    /// (the published curve is a long run's: its cache has filled).
    fn outcome(&self, share: f64) -> CacheOutcome {
        match self {
            Curve::Published => CacheOutcome {
                hit: forecast::interpolate(&forecast::PUBLISHED_DEFAULT, share),
                fill_share: 0.0,
            },
            Curve::Trace((h, d)) => {
                let budget = (h.expert_bytes() as f64 * share.clamp(0.0, 1.0)) as u64;
                let r = replay::replay(h, d, budget, CachePolicy::default());
                CacheOutcome {
                    hit: r.generation_hit_pct() / 100.0,
                    fill_share: r.generation_fill_bytes as f64
                        / r.generation_read_bytes.max(1) as f64,
                }
            }
        }
    }

    fn describe(&self, path: Option<&Path>, run: Option<RunShape>) -> String {
        match (self, path, run) {
            (Curve::Trace(_), Some(p), Some(r)) => format!(
                "{} as a forced run of {} prompt tokens and {} generated hands it, from a cold \
                 cache, replayed under the default policy",
                p.display(),
                r.prompt_tokens,
                r.generated_tokens
            ),
            (Curve::Trace(_), Some(p), None) => {
                format!("{} replayed under the default policy", p.display())
            }
            _ => "gpt-oss-20b's published routing under the default policy (docs/cache.md, \
                  \"Real routing\"); a --route-trace of this model is closer"
                .into(),
        }
    }
}

/// The trace's demands, refused (as `--cache-warm` refuses another model's
/// profile) when it was recorded on another model: its hit curve would be
/// that model's.
fn load_trace(
    p: &Path,
    model: &Path,
    l: &MoeLayout,
    run: Option<RunShape>,
) -> Result<(bmoe_trace::route_trace::TraceHeader, replay::Demands)> {
    let (header, records, _note) = super::replay::read_trace(p)?;
    let own = bmoe::stream::route_trace_header(model, l, l.n_expert_used);
    if let Some(why) = header.differs_from(&own) {
        return Err(UsageError(format!(
            "--route-trace {} is another model's trace ({why}): record one of this model with \
             bmoe run -m {} --route-trace FILE, or import its log with bmoe trace import --like {}",
            p.display(),
            model.display(),
            model.display()
        ))
        .into());
    }
    let demands = match (run, ForcedRoutes::from_records(&header, &records)) {
        (Some(run), Some(routes)) => {
            let layers: Vec<u32> = l
                .expert_layers()
                .into_iter()
                .filter(|&layer| routes.routes_layer(layer))
                .collect();
            replay::demands(&routes.run_records(&layers, run))
        }
        _ => replay::demands(&records),
    };
    if demands.demands.is_empty() {
        return Err(UsageError(format!(
            "--route-trace {} holds no demands: record it with bmoe run --route-trace FILE on a \
             streamed run",
            p.display()
        ))
        .into());
    }
    Ok((header, demands))
}

/// `--forced-run PROMPT,TOKENS`: a prompt of 1 or more tokens, 1 or more generated.
fn parse_run_shape(s: &str) -> std::result::Result<RunShape, String> {
    let bad = || format!("{s}: give PROMPT,TOKENS, two whole numbers of 1 or more (e.g. 15,64)");
    let (p, n) = s.split_once(',').ok_or_else(bad)?;
    let num = |x: &str| {
        x.trim()
            .parse::<u32>()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(bad)
    };
    Ok(RunShape {
        prompt_tokens: num(p)?,
        generated_tokens: num(n)?,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_run_shape, probe_ctx};
    use bmoe::engine::DEFAULT_N_CTX;

    #[test]
    fn the_decode_probe_takes_the_runs_context_within_the_training_one() {
        assert_eq!(probe_ctx(None), DEFAULT_N_CTX);
        assert_eq!(probe_ctx(Some(0)), DEFAULT_N_CTX);
        assert_eq!(probe_ctx(Some(40_960)), DEFAULT_N_CTX);
        assert_eq!(probe_ctx(Some(1024)), 1024);
        assert_eq!(probe_ctx(Some(u64::MAX)), DEFAULT_N_CTX);
    }

    #[test]
    fn a_forced_run_is_a_prompt_and_a_length() {
        let r = parse_run_shape("15, 64").expect("a shape");
        assert_eq!((r.prompt_tokens, r.generated_tokens), (15, 64));
        for bad in ["15", "0,64", "15,0", "a,b", "15,64,1", "-1,2"] {
            let e = parse_run_shape(bad).unwrap_err();
            assert!(e.contains("PROMPT,TOKENS"), "{bad}: {e}");
        }
    }
}
