//! Run's own groups: what it generates (the prompt, its length and ends,
//! its prompt cache file, forced routing) and what it writes beside the text
//! (`--csv`, `--progress`, `--route-trace`). Chat and serve take neither:
//! their prompts and figures come another way.

use std::path::PathBuf;

use clap::Args;

/// The prompt and how its continuation is generated.
#[derive(Debug, Args)]
#[command(next_help_heading = "Generation")]
pub struct GenerationArgs {
    /// Prompt text.
    #[arg(short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short, long)]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub tokens: super::tokens::TokensArg,
    /// End generation where this text first appears (left out of the output);
    /// repeat the flag for several.
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Never stop at the end of text: end-of-generation tokens are not chosen
    /// (the best other token is), so exactly -n tokens are generated.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Wrap the prompt in the model's own chat template (its Jinja
    /// `tokenizer.chat_template`, rendered as Hugging Face transformers
    /// renders it; llama.cpp's built-in chatml only for a file without one).
    #[arg(long)]
    pub chat: bool,
    /// Print the prompt as the model would get it (rendered with the chat
    /// template under --chat) and its token count, then exit without
    /// generating (only the model's vocabulary is loaded).
    #[arg(long)]
    pub show_prompt: bool,
    /// The prompt's KV state in FILE: restored when its tokens start the
    /// prompt, else written after the prefill (serve's cache is a directory,
    /// `serve --prompt-cache DIR|off`; docs/serving.md).
    #[arg(long, value_name = "FILE")]
    pub prompt_cache_file: Option<PathBuf>,
    /// Forced routing: at every MoE layer each row's routed experts are the
    /// route trace's for that token (`--route-trace` or `bmoe trace import`;
    /// prompt rows, then decodes, wrapping at its end), so the reads, stalls,
    /// cache and compute are the traced model's. The text is meaningless by
    /// design. Streamed or --resident; not with speculation or --rpc.
    #[arg(long, value_name = "TRACE")]
    pub route_from: Option<PathBuf>,
}

/// What a run writes beside its text.
#[derive(Debug, Args)]
#[command(next_help_heading = "Outputs")]
pub struct OutputArgs {
    /// Write per-token telemetry to this CSV (preamble, one row per token, trailer).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Print one `BMOE_PROGRESS {json}` line per token on stdout (instead of the text).
    #[arg(long)]
    pub progress: bool,
    /// Write every verify decode's routing (layer, routed ids of each row) to
    /// FILE, for `bmoe replay` (format: docs/cache.md). Streaming only
    /// (refused beside --resident); not with --mtp.
    #[arg(long, value_name = "FILE", conflicts_with = "resident")]
    pub route_trace: Option<PathBuf>,
}
