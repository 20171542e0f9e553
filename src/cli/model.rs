//! The model group (`-m`, `-c`, `-t`, `--ubatch`, `--n-expert-used`,
//! `--chat-template-file`, `--rpc`) that run, chat and serve all take, and
//! the engine settings those shared groups (model, streaming, sampling)
//! build: each command adds only its own.

use std::path::PathBuf;

use clap::Args;

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
        cfg.resident_if_fits = self.streaming.resident_if_fits(&extras);
        cfg.mode = self.streaming.mode(extras);
        cfg.stream_explicit = self.streaming.stream.moe_stream;
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
