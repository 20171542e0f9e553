//! Command-line interface definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `print!` that returns the stdout error instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {
        bmoe::stdio::out(&format!($($t)*))?
    };
}

/// `println!` that returns the stdout error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {
        bmoe::stdio::out(&(format!($($t)*) + "\n"))?
    };
}

pub mod chat;
pub mod checks;
pub mod commands;
pub mod fixture;
pub mod graph;
pub mod inspect;
pub mod prompt_cache;
pub mod replay;
pub mod rpc;
pub mod run;
pub mod sampling;
pub mod serve;
pub mod stream;
pub mod trace;

#[derive(Debug, Parser)]
#[command(
    name = "bmoe",
    version,
    about = "Run Mixture-of-Experts models bigger than RAM: dense weights resident, experts streamed"
)]
pub struct Cli {
    /// More log output (-v: llama.cpp's log and debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Write every actor step as a span to this Chrome/Perfetto trace (JSON; open it
    /// in ui.perfetto.dev). See docs/tracing.md.
    #[arg(long, global = true, value_name = "FILE")]
    pub trace_chrome: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text (greedy unless --temp), streaming it to stdout.
    Run(RunArgs),
    /// Serve an OpenAI-compatible API (chat and text completions, streamed or
    /// whole) from one loaded model whose KV and expert caches stay warm
    /// between requests (docs/serving.md). Takes run's model, cache and
    /// sampling flags (the sampling ones as the requests' defaults).
    Serve(serve::ServeArgs),
    /// A multi-turn chat in the terminal with the model's chat template; each
    /// turn decodes only its new tokens (the history stays in the KV cache).
    /// Takes run's model, cache and sampling flags (-n caps each reply).
    Chat(chat::ChatArgs),
    /// Describe a gguf: layers, experts, slice sizes, dense/expert bytes;
    /// with --rpc-layers how --rpc would split it, with --forecast the decode
    /// rate to expect on this host.
    Inspect(inspect::InspectArgs),
    /// Measure this host's limits for a model: io_uring expert-slice read bandwidth per queue depth.
    Probe(ProbeArgs),
    /// Compare runs side by side from their `--csv` files (rate with a bootstrap
    /// interval, MiB/token, hit, stall); the legend lists the settings that differ.
    Compare {
        /// Telemetry CSVs written by `bmoe run --csv`.
        #[arg(required = true, num_args = 1..)]
        csv: Vec<PathBuf>,
        /// Allow comparing speculated with plain runs.
        #[arg(long)]
        mixed: bool,
    },
    /// Run a matrix of `bmoe run` configurations side by side (interleaved, the
    /// baseline repeated), against this host's physical bound; writes each run's
    /// CSV and a summary.md. See docs/benchmarks.md.
    Bench(BenchArgs),
    /// Replay a route trace (`bmoe run --route-trace FILE`) through the expert
    /// cache at each budget and policy, beside the offline optimum: size the
    /// cache in seconds instead of reruns. See docs/cache.md.
    Replay(ReplayArgs),
    /// Route traces from elsewhere: `trace import` turns another tool's
    /// routing log into one for `bmoe replay`.
    #[command(subcommand)]
    Trace(trace::TraceCmd),
    /// Build or fetch the offline test models.
    #[command(subcommand)]
    Fixture(fixture::FixtureCmd),
    /// Serve this host's CPU and memory to `--rpc` runs on other hosts
    /// (llama.cpp's RPC server, the same protocol by construction): they put
    /// their last layers here. Loopback unless --allow-remote. Until killed.
    RpcServer(rpc::RpcServerArgs),
    /// Internal: build the model's graph with K experts per token (exit 0 when
    /// llama.cpp can; it aborts when it cannot). See `--n-expert-used`.
    #[command(hide = true)]
    CheckGraph {
        #[arg(short, long)]
        model: PathBuf,
        #[arg(long)]
        n_expert_used: u32,
        #[arg(short = 'c', long, default_value_t = bmoe::engine::DEFAULT_N_CTX)]
        ctx: u32,
    },
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The route trace (written by `bmoe run --route-trace FILE`).
    pub trace: PathBuf,
    /// Cache budgets: MiB or shares of the model's expert bytes, comma-separated.
    #[arg(
        long,
        value_name = "MIB|P%,...",
        value_delimiter = ',',
        default_value = "10%,25%,50%"
    )]
    pub cache_mb: Vec<bmoe::stream::CacheSize>,
    /// Policies to replay, comma-separated.
    #[arg(
        long,
        value_name = "POLICY,...",
        value_delimiter = ',',
        default_value = "lru,lfu,cycle"
    )]
    pub policy: Vec<bmoe_flash::cache::CachePolicy>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model gguf. Default: SmolLM2 upcycled to 64 experts / top-4 (built if missing).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Cells file: one `name: bmoe-run-flags` per line, the first is the baseline.
    #[arg(long, conflicts_with = "preset")]
    pub cells: Option<PathBuf>,
    /// A built-in matrix: cache, overlap, small-host, bigger-than-ram, spec, spec-stream, prefill, lossy (default: cache).
    #[arg(long)]
    pub preset: Option<String>,
    /// Prompt: a shipped workload (prose, copy, long, p64, p512, p2048) or a prompt file.
    #[arg(short, long, default_value = "prose")]
    pub workload: String,
    /// Tokens generated per run.
    #[arg(short = 'n', long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..))]
    pub tokens: u32,
    /// Rounds over the matrix (the baseline runs once more).
    #[arg(short, long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeats: u32,
    /// Output directory (runs/, prompt.txt, summary.md); created if missing.
    #[arg(short, long)]
    pub out: PathBuf,
    /// Emulate a host with about this much available memory: the bench holds
    /// the rest of MemAvailable (touched anonymous memory, a balloon) for the
    /// duration of the matrix.
    #[arg(long, value_name = "MIB")]
    pub ram_limit_mb: Option<u64>,
    /// Queue depths of the read probe (each 1..=256, the io_uring reader's limit).
    /// Default: the depths the streamed cells read at (`--io-threads`, else 4).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
    pub probe_depths: Option<Vec<u32>>,
    /// Seconds per probed depth (the probe runs in every round).
    #[arg(long, default_value_t = 1.0)]
    pub probe_seconds: f64,
    /// A run taking longer than this many seconds is killed and counted as failed.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub run_timeout_s: u64,
    /// Keep adding rounds (at least --repeats, at least 2) until every cell's ratio
    /// to the baseline has a 95% interval narrower than WIDTH relative to the
    /// ratio (0.1: about ±5%), or --max-repeats rounds have run (said in the summary).
    #[arg(long, value_name = "WIDTH")]
    pub until_stable: Option<f64>,
    /// The most rounds --until-stable may run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=50))]
    pub max_repeats: u32,
    /// Testing only: keep a core busy (a thread of the bench) beside these runs (1-based,
    /// in the order they run), to check that their conditions are flagged.
    #[arg(long, hide = true, value_delimiter = ',', value_name = "RUNS")]
    pub busy_neighbour: Vec<usize>,
    /// Forced routing in every cell: each run gets `bmoe run --route-from
    /// TRACE` (the trace's routing, so the reads and cache are a real
    /// model's; the text is meaningless by design).
    #[arg(long, value_name = "TRACE")]
    pub route_from: Option<PathBuf>,
}

/// `--spec`'s draft source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecSource {
    /// The n-gram matcher when it has a match, else the MTP head (when the
    /// model has one).
    Auto,
    Ngram,
    Mtp,
    Off,
}

impl RunArgs {
    /// N-gram drafts, ungated (`--ngram`) or gated (`--spec ngram|auto`).
    pub fn uses_ngram(&self) -> bool {
        self.ngram || matches!(self.spec, Some(SpecSource::Ngram | SpecSource::Auto))
    }

    /// MTP drafts, ungated (`--mtp`) or gated (`--spec mtp`, and `--spec auto`
    /// on a model with a head).
    pub fn uses_mtp(&self) -> bool {
        self.mtp || matches!(self.spec, Some(SpecSource::Mtp | SpecSource::Auto))
    }
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("speculation").args(["ngram", "mtp", "spec"])))]
pub struct RunArgs {
    /// Model gguf. Default: SmolLM2 upcycled to 64 experts / top-4, built into the cache if missing.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short, long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (at least 1).
    #[arg(short = 'n', long = "n-predict", default_value_t = bmoe::engine::DEFAULT_N_PREDICT, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_predict: u32,
    #[command(flatten)]
    pub sampling: sampling::SamplingArgs,
    /// Never stop at the end of text: end-of-generation tokens are not chosen
    /// (the best other token is), so exactly -n tokens are generated.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Wrap the prompt in the model's own chat template (its Jinja
    /// `tokenizer.chat_template`, rendered as Hugging Face transformers
    /// renders it; llama.cpp's built-in chatml only for a file without one).
    #[arg(long)]
    pub chat: bool,
    /// Use this Jinja chat template instead of the model file's own (for
    /// --chat, chat and serve).
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Print the prompt as the model would get it (rendered with the chat
    /// template under --chat) and its token count, then exit without
    /// generating (only the model's vocabulary is loaded).
    #[arg(long)]
    pub show_prompt: bool,
    /// Compute threads (default: all cores).
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Context size in tokens (llama.cpp rounds it up to a multiple of 256).
    #[arg(short = 'c', long = "ctx", default_value_t = bmoe::engine::DEFAULT_N_CTX, value_parser = clap::value_parser!(u32).range(16..))]
    pub ctx: u32,
    /// The prompt's micro-batch in tokens (16..=8192): auto runs the whole prompt
    /// as one micro-batch when its compute buffers fit (so a streamed prompt reads
    /// each routed expert once), else in the fewest equal ones; capped by --ctx.
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    pub ubatch: bmoe::engine::Ubatch,
    /// Keep llama.cpp's plain mmap path for the experts (the comparison baseline);
    /// refused beside any streaming flag.
    #[arg(long, conflicts_with = "StreamArgs")]
    pub resident: bool,
    #[command(flatten)]
    pub stream: stream::StreamArgs,
    /// Forced routing: at every MoE layer each row's routed experts are the
    /// route trace's for that token (`--route-trace` or `bmoe trace import`;
    /// prompt rows, then decodes, wrapping at its end), so the reads, stalls,
    /// cache and compute are the traced model's. The text is meaningless by
    /// design. Streamed or --resident; not with speculation or --rpc.
    #[arg(long, value_name = "TRACE")]
    pub route_from: Option<PathBuf>,
    /// Self-speculative decoding with n-gram drafts: the longest earlier match of
    /// the text's suffix proposes what followed it; the model verifies the drafts
    /// in one wider decode and keeps only tokens equal to its own argmax.
    #[arg(long, conflicts_with = "mtp")]
    pub ngram: bool,
    /// Self-speculative decoding with the model's own MTP (nextn) head as the
    /// drafter (a model with nextn layers). The head runs on a draft actor
    /// thread; when streaming, its experts stream too.
    #[arg(long)]
    pub mtp: bool,
    /// With --mtp: stop drafting once the head's top probability falls below F.
    /// (clap's `requires` is met by any member of the `speculation` group, so
    /// main checks the pairing too.)
    #[arg(long, value_name = "F", requires = "mtp")]
    pub mtp_p_min: Option<f32>,
    /// With --mtp and streaming: after drafting, have the flash actor read the
    /// experts of the head's drafting pass in the background while the verify
    /// decode computes (its catch-up routes mostly to them). Off by default: on
    /// a 2-core host it costs the verify decode about what it saves the head.
    #[arg(long, requires = "mtp")]
    pub head_predemand: bool,
    /// Speculation behind a cost gate: before each step, verify only as many
    /// of the source's drafts (0..=--draft) as maximise the expected tokens per
    /// second, from the acceptance, decode cost per batch width and drafting
    /// cost measured so far in this run. ngram or mtp as with --ngram/--mtp
    /// (which verify every draft); auto: the n-gram matcher when it has a
    /// match, else the MTP head when the model has one; off: no speculation
    /// (docs/speculation.md).
    #[arg(long, value_name = "auto|ngram|mtp|off")]
    pub spec: Option<SpecSource>,
    /// Draft width: tokens verified per decode with speculation (1..=8).
    #[arg(long, value_name = "N", default_value_t = bmoe::engine::DEFAULT_DRAFT, requires = "speculation", value_parser = clap::value_parser!(u32).range(1..=bmoe::engine::MAX_DRAFT as i64))]
    pub draft: u32,
    /// Shortest suffix match that may draft with --ngram.
    /// Default 3.
    #[arg(long, value_name = "M", requires = "ngram", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub ngram_min_match: Option<u32>,
    /// LOSSY: route each token to K experts instead of the model's count.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub n_expert_used: Option<u32>,
    /// Write per-token telemetry to this CSV (preamble, one row per token, trailer).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Print one `BMOE_PROGRESS {json}` line per token on stdout (instead of the text).
    #[arg(long)]
    pub progress: bool,
    #[command(flatten)]
    pub rpc: rpc::RpcArgs,
    /// The prompt cache. run: a state FILE, restored when its tokens start
    /// the prompt, else written after the prefill; serve: a DIR (default
    /// `prompt-cache` in bmoe's cache folder) or off (docs/serving.md).
    #[arg(long, value_name = "FILE|DIR|off")]
    pub prompt_cache: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Model gguf (default: the default upcycled model).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Queue depths to measure (each 1..=256, the io_uring reader's limit).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub depths: Vec<u32>,
    /// Seconds per depth.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Read through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,
    /// Tokens of the resident decode that measures the compute rate, run with the
    /// model file read into the page cache first (0 skips it).
    #[arg(long, default_value_t = 32)]
    pub resident_tokens: u32,
}

/// The flags of `run` that `chat` and `serve` take from it but refuse
/// ([`checks::refuse_run_only`]), by clap id: left out of their `--help`.
const RUN_ONLY: [&str; 16] = [
    "prompt",
    "file",
    "chat",
    "csv",
    "progress",
    "route_trace",
    "route_from",
    "ngram",
    "mtp",
    "spec",
    "draft",
    "ngram_min_match",
    "mtp_p_min",
    "head_predemand",
    "ignore_eos",
    "show_prompt",
];

/// The command line, each command's `--help` listing only the flags it takes.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let hide = |mut c: clap::Command, ids: &[&str]| {
        for id in ids {
            c = c.mut_arg(*id, |a| a.hide(true));
        }
        c
    };
    Cli::command()
        .mut_subcommand("chat", |c| hide(hide(c, &RUN_ONLY), &["prompt_cache"]))
        .mut_subcommand("serve", |c| hide(hide(c, &RUN_ONLY), &["stop"]))
}

/// Parse the process's arguments (clap's own exit on `--help` and errors).
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
}

/// `bmoe ARGV...` parsed as `run` (a test's plain run and its flags).
#[cfg(test)]
pub(crate) fn parse_run(argv: &[&str]) -> RunArgs {
    use clap::FromArgMatches;
    let m = command().try_get_matches_from(argv).expect("a run parses");
    match Cli::from_arg_matches(&m).expect("the arguments").command {
        Command::Run(args) => args,
        other => panic!("not a run: {other:?}"),
    }
}
