//! The model group (`-m`, `-c`, `-t`, `--ubatch`, `--n-expert-used`,
//! `--chat-template-file`, `--rpc`) that run, chat and serve all take, and
//! the engine settings those shared groups (model, streaming, sampling)
//! build: each command adds only its own.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;

use bmoe::fixture;

use bmoe::engine::{RunConfig, DEFAULT_N_CTX};

use super::rpc::RpcArgs;
use super::sampling::SamplingArgs;
use super::stream::{StreamExtras, StreamingArgs};
use super::usage::{self, UsageError};

/// Which model runs, and how it is laid out and computed.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// Model gguf. Default: SmolLM2 upcycled to 64 experts / top-4, built into the cache if missing.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Context size in tokens (llama.cpp rounds it up to a multiple of 256).
    #[arg(short = 'c', long = "ctx", default_value_t = DEFAULT_N_CTX, value_parser = clap::value_parser!(u32).range(16..))]
    pub ctx: u32,
    /// The prompt's micro-batch in tokens (16..=8192): auto runs the whole prompt
    /// as one micro-batch when its compute buffers fit (so a streamed prompt reads
    /// each routed expert once), else in the fewest equal ones; capped by --ctx.
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    pub ubatch: bmoe::engine::Ubatch,
    /// LOSSY: route each token to K experts instead of the model's count.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub n_expert_used: Option<u32>,
    /// Use this Jinja chat template instead of the model file's own (for
    /// run --chat, chat and serve).
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    #[command(flatten)]
    pub rpc: RpcArgs,
}

/// The groups run, chat and serve share, borrowed from a command's flags.
pub struct Shared<'a> {
    pub model: &'a ModelArgs,
    pub streaming: &'a StreamingArgs,
    pub sampling: &'a SamplingArgs,
}

impl Shared<'_> {
    /// The engine's configuration for `model` and `prompt` as the shared
    /// groups set it, `n_predict` tokens at most and the streaming settings
    /// only the command knows (`extras`): complete for chat and serve; run
    /// adds its generation flags.
    pub fn engine_config(
        &self,
        model: PathBuf,
        prompt: String,
        n_predict: u32,
        extras: StreamExtras,
    ) -> Result<RunConfig, UsageError> {
        let m = self.model;
        let mut cfg = RunConfig::new(model, prompt);
        cfg.chat_template = template_file(m)?;
        cfg.job.n_predict = n_predict;
        if let Some(t) = m.threads {
            cfg.threads = t;
        }
        cfg.n_ctx = m.ctx;
        cfg.mode = self.streaming.mode(extras);
        cfg.n_expert_used = m.n_expert_used;
        cfg.ubatch = m.ubatch;
        cfg.job.sampling = self.sampling.params()?;
        cfg.rpc = m.rpc.config();
        cfg.prompt_states.model_id_memo =
            bmoe::fixture::cache_dir().ok().map(|d| d.join("model-ids"));
        Ok(cfg)
    }
}

/// `--chat-template-file`: the template's text (a clear error for a file
/// that cannot be read or is not UTF-8).
fn template_file(args: &ModelArgs) -> Result<Option<String>, UsageError> {
    let Some(path) = &args.chat_template_file else {
        return Ok(None);
    };
    usage::read_text_file("the --chat-template-file", path, "").map(Some)
}

/// What run, chat and serve all read: the model, the chat template file
/// and the `--cache-warm` profile (read, then updated: no other output may
/// replace it).
pub fn shared_inputs<'a>(s: &Shared<'a>) -> Vec<&'a Path> {
    let warm = match &s.streaming.stream.cache_warm {
        bmoe::stream::WarmSource::File(f) => Some(f.as_path()),
        _ => None,
    };
    s.model
        .model
        .iter()
        .chain(s.model.chat_template_file.iter())
        .map(|p| p.as_path())
        .chain(warm)
        .collect()
}

/// The flag values of the groups run, chat and serve share that clap
/// cannot check.
pub fn shared_args(s: &Shared) -> Result<(), UsageError> {
    s.sampling.params()?;
    let drop_cold = s.streaming.stream.drop_cold_experts;
    if !(drop_cold.is_finite() && (0.0..=1.0).contains(&drop_cold)) {
        return Err(UsageError(format!(
            "--drop-cold-experts {}: give a fraction in 0..=1 (0 is off; 0.75 skips missing \
             experts weighted below 0.75 x 1/k)",
            drop_cold
        )));
    }
    Ok(())
}

/// More compute threads than cores make every decode wait for descheduled
/// workers: measured on a 2-core host, E8K2 took 4.5 s per token at -t 3 and
/// 13.7 s at -t 8 (against tens of ms at -t 2).
pub fn warn_threads_above_cores(threads: Option<u32>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    if let Some(t) = threads.filter(|&t| t > cores) {
        bmoe::say!(
            "warning: -t {t} is more than the {cores} cores available: each decode then waits for \
             descheduled threads (measured on 2 cores: -t 3 over 100x slower than -t 2); \
             leave -t out to use {cores}"
        );
    }
}

/// The model given with -m, or the default one (prepared if need be).
pub fn model_or_default(model: &Option<PathBuf>) -> Result<PathBuf> {
    Ok(match model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    })
}
