//! The command line's top: `bmoe`'s commands and the flags of those that
//! have no file of their own here (run's groups, bench, probe).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::{
    chat, fixture, generation, inspect, model, replay, rpc, sampling, serve, spec, stream, trace,
};

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
    /// between requests (docs/serving.md). Takes run's model, streaming and
    /// sampling flags (the sampling ones as the requests' defaults).
    Serve(serve::ServeArgs),
    /// A multi-turn chat in the terminal with the model's chat template; each
    /// turn decodes only its new tokens (the history stays in the KV cache).
    /// Takes run's model, streaming and sampling flags (-n caps each reply).
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
    Replay(replay::ReplayArgs),
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

/// `bmoe run`'s flags: the groups chat and serve share (model, streaming,
/// sampling) and run's own (generation, outputs, speculation).
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: model::ModelArgs,
    #[command(flatten)]
    pub streaming: stream::StreamingArgs,
    #[command(flatten)]
    pub sampling: sampling::SamplingArgs,
    #[command(flatten)]
    pub generation: generation::GenerationArgs,
    #[command(flatten)]
    pub outputs: generation::OutputArgs,
    #[command(flatten)]
    pub spec: spec::SpecArgs,
}

impl RunArgs {
    /// The groups run shares with chat and serve.
    pub fn shared(&self) -> model::Shared<'_> {
        model::Shared {
            model: &self.model,
            streaming: &self.streaming,
            sampling: &self.sampling,
        }
    }
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

/// The command line: each command's `--help` lists the groups it composes,
/// and no more (`tests::each_command_takes_exactly_its_groups`).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
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
