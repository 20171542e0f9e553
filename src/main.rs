//! The `bmoe` binary: argument parsing, logging, and the error-to-exit-code edge.

#[macro_use]
mod cli;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;

use bmoe::chrome_trace::ChromeTrace;
use bmoe::engine::{self, EngineError};
use bmoe::fixture::FixtureError;
use bmoe::llama::LlamaError;
use cli::checks::{self, UsageError};
use cli::{Cli, Command};

/// Exit codes (also documented in the README).
mod exit {
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const MODEL_MISSING: u8 = 3;
    pub const MODEL_INVALID: u8 = 4;
    /// An RPC host unreachable, lost or stalled (`--rpc`).
    pub const REMOTE: u8 = bmoe::llama::rpc::EXIT_REMOTE_LOST as u8;
}

/// The error and its causes on one line, each said once (a message that
/// already includes its source, as most of ours do, is not repeated).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if !out.contains(&t) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&t);
        }
    }
    out
}

fn main() -> ExitCode {
    // `bmoe __render-chat-template`: the chat template renderer, run by bmoe itself.
    if let Some(code) = bmoe::chat::sandbox::child_main() {
        return code;
    }
    let cli = cli::parse();
    if let Some(t) = cli.trace_chrome.as_deref() {
        if let Err(e) = checks::output_file("--trace-chrome", t, &checks::inputs(&cli.command)) {
            bmoe::say!("error: {e}");
            return ExitCode::from(exit::USAGE);
        }
    }
    let trace = match init_tracing(cli.verbose, cli.trace_chrome.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            bmoe::say!("error: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    bmoe::interrupt::install();
    // A server stopped by SIGINT/SIGTERM has done its job: exit 0.
    let serving = matches!(cli.command, Command::Serve(_));
    let mut res = dispatch(cli);
    if let Some(t) = trace {
        match t.finish() {
            Ok(n) => bmoe::say!("trace: {n} events written to {}", t.path().display()),
            // A trace that could not be written fails the run (a bench must
            // not count it as measured).
            Err(e) if res.is_ok() => res = Err(e.into()),
            Err(e) => bmoe::say!("error: {e}"),
        }
    }
    match res {
        Ok(()) => match bmoe::interrupt::requested() {
            Some(sig) if !serving => ExitCode::from(bmoe::interrupt::exit_code(sig)),
            _ => ExitCode::SUCCESS,
        },
        Err(e) => {
            let _ = std::io::stdout().flush();
            bmoe::say!("error: {}", error_text(&e));
            // Whatever stopped after a signal asked it to stops with the signal's code.
            match bmoe::interrupt::requested() {
                Some(sig) => ExitCode::from(bmoe::interrupt::exit_code(sig)),
                None => ExitCode::from(exit_code(&e)),
            }
        }
    }
}

/// The text log on stderr (`-v`, `RUST_LOG`) and, with `--trace-chrome`, the
/// Chrome/Perfetto trace of every debug-level span (independent of the log filter).
fn init_tracing(
    verbose: u8,
    chrome: Option<&std::path::Path>,
) -> Result<Option<ChromeTrace>, bmoe::chrome_trace::ChromeTraceError> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let default = match verbose {
        0 => "warn,llama.cpp=error",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a terminal (not in a log file or a pipe).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(true)
        .with_filter(filter);
    let (handle, chrome_layer) = match chrome {
        Some(p) => {
            let (h, l) = ChromeTrace::create(p)?;
            let spans = tracing_subscriber::filter::Targets::new()
                .with_target("bmoe", tracing::Level::DEBUG)
                .with_target("bmoe_flash", tracing::Level::DEBUG)
                .with_target("bmoe_decode", tracing::Level::DEBUG)
                .with_target("bmoe_trace", tracing::Level::DEBUG);
            (Some(h), Some(l.with_filter(spans)))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(chrome_layer)
        .try_init();
    Ok(handle)
}

fn llama_code(e: &LlamaError) -> Option<u8> {
    match e {
        LlamaError::Missing { .. } | LlamaError::Io { .. } | LlamaError::ShardMissing { .. } => {
            Some(exit::MODEL_MISSING)
        }
        LlamaError::NotGguf { .. }
        | LlamaError::Truncated { .. }
        | LlamaError::Corrupt { .. }
        | LlamaError::ShardMismatch { .. } => Some(exit::MODEL_INVALID),
        LlamaError::Rpc(
            bmoe::llama::rpc::RpcError::BadAddress(_) | bmoe::llama::rpc::RpcError::Duplicate(_),
        ) => Some(exit::USAGE),
        LlamaError::Rpc(_) => Some(exit::REMOTE),
        _ => None,
    }
}

/// The one mapping from an error to the exit code, for every command: the
/// first cause in the chain with a documented code decides (README, "Exit
/// codes"); anything else is a runtime failure.
fn exit_code(e: &anyhow::Error) -> u8 {
    e.chain().find_map(cause_code).unwrap_or(exit::FAILURE)
}

/// The documented code of one cause, if it has one.
fn cause_code(cause: &(dyn std::error::Error + 'static)) -> Option<u8> {
    if let Some(l) = cause.downcast_ref::<LlamaError>() {
        return llama_code(l);
    }
    if let Some(e) = cause.downcast_ref::<EngineError>() {
        return engine_code(e);
    }
    // `ServeError::Engine` is transparent: its engine error is not a cause of
    // its own in the chain.
    if let Some(bmoe::serve::ServeError::Engine(e)) = cause.downcast_ref() {
        return engine_code(e);
    }
    if let Some(e) = cause.downcast_ref::<bmoe::serve::supervisor::SupervisorError>() {
        return e.engine_code();
    }
    match cause.downcast_ref::<FixtureError>() {
        Some(FixtureError::Llama(l)) => return llama_code(l),
        Some(FixtureError::Invalid(_)) => return Some(exit::USAGE),
        _ => {}
    }
    if cause
        .downcast_ref::<bmoe::chat::TemplateError>()
        .is_some_and(bmoe::chat::TemplateError::is_bad_input)
    {
        return Some(exit::USAGE);
    }
    if cause.downcast_ref::<UsageError>().is_some()
        || cause
            .downcast_ref::<bmoe::lab::compare::CompareError>()
            .is_some()
    {
        return Some(exit::USAGE);
    }
    None
}

/// An engine error's code, the same whichever command ran the engine: the
/// model file's codes, or usage for a refusal ([`EngineError::is_refusal`]).
fn engine_code(e: &EngineError) -> Option<u8> {
    match e {
        EngineError::Llama(l) => llama_code(l),
        EngineError::Failed { cause, .. } => engine_code(cause),
        e if e.is_refusal() => Some(exit::USAGE),
        _ => None,
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => cli::run::run(args),
        Command::Serve(args) => cli::serve::serve(args),
        Command::Chat(args) => cli::chat::chat(args),
        Command::Inspect(a) => cli::inspect::inspect(a),
        Command::Probe(p) => cli::commands::probe(p),
        Command::Compare { csv, mixed } => {
            use bmoe::lab::compare::{self, CompareError, RunCsv};
            let runs = csv
                .iter()
                .map(|p| RunCsv::open(p))
                .collect::<Result<Vec<_>, _>>()?;
            match compare::compare(&runs, mixed) {
                Ok(table) => {
                    out!("{table}");
                    Ok(())
                }
                Err(e @ CompareError::Mixed { .. }) => Err(UsageError(e.to_string()).into()),
                Err(e) => Err(e.into()),
            }
        }
        Command::Bench(b) => cli::commands::bench(b),
        Command::Replay(r) => cli::replay::replay(r),
        Command::Trace(t) => cli::trace::trace_cmd(t),
        Command::Fixture(f) => cli::fixture::fixture_cmd(f),
        Command::RpcServer(a) => cli::rpc::rpc_server(a),
        Command::CheckGraph {
            model,
            n_expert_used,
            ctx,
        } => {
            cli::graph::no_core_dumps();
            Ok(engine::graph_check::build_graph(
                &model,
                n_expert_used,
                ctx,
            )?)
        }
    }
}
