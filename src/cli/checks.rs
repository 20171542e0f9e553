//! Checks of arguments after parsing: flag ranges and pairings clap cannot
//! express, outputs that would replace an input, and the prompt file.

use std::path::Path;

use super::{Command, RunArgs};

/// Bad flags or flag combinations found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The files a command reads, which no output may replace.
pub fn inputs(cmd: &Command) -> Vec<&Path> {
    match cmd {
        Command::Run(a) => run_inputs(a),
        _ => Vec::new(),
    }
}

pub fn run_inputs(a: &RunArgs) -> Vec<&Path> {
    a.model
        .iter()
        .chain(a.file.iter())
        .map(|p| p.as_path())
        .collect()
}

/// Refuse the flags of `run` that `bmoe COMMAND` (chat, serve) has no use
/// for: prompts, telemetry files and speculation, and the command's `extra`
/// (flag, given) pairs; `why` says where those things come from instead.
pub fn refuse_run_only(
    command: &str,
    a: &RunArgs,
    extra: &[(&str, bool)],
    why: &str,
) -> Result<(), UsageError> {
    let given = [
        ("-p/--prompt", a.prompt.is_some()),
        ("-f/--file", a.file.is_some()),
        ("--chat", a.chat),
        ("--csv", a.csv.is_some()),
        ("--progress", a.progress),
        ("--route-trace", a.route_trace.is_some()),
        ("--ngram/--mtp/--spec", a.ngram || a.mtp || a.spec.is_some()),
        ("--ignore-eos", a.ignore_eos),
        ("--show-prompt", a.show_prompt),
    ];
    match given.iter().chain(extra).find(|(_, g)| *g) {
        Some((flag, _)) => Err(UsageError(format!(
            "bmoe {command} does not take {flag}: {why}"
        ))),
        None => Ok(()),
    }
}

/// Refuse an output (`--csv`, `--trace-chrome`) that names one of the run's
/// inputs (the model, the prompt file): it would be replaced when the run ends.
pub fn refuse_output_over_input(
    flag: &str,
    out: &Path,
    inputs: &[&Path],
) -> Result<(), UsageError> {
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

/// The flag values and pairings of `bmoe run` that clap cannot check: called
/// for a run, and for every bench cell before anything is measured.
pub fn run_args(args: &RunArgs) -> Result<(), UsageError> {
    args.sampling.params()?;
    // --show-prompt runs nothing: the run's outputs would never be written.
    let outputs = [
        ("--csv", args.csv.is_some()),
        ("--route-trace", args.route_trace.is_some()),
    ];
    if let Some((flag, _)) = outputs.iter().find(|(_, g)| *g && args.show_prompt) {
        return Err(UsageError(format!(
            "--show-prompt only prints the prompt and runs nothing, so {flag} would never be \
             written: drop one of them"
        )));
    }
    args.sampling
        .check_speculation(args.uses_ngram() || args.uses_mtp())?;
    if !(args.drop_cold_experts.is_finite() && (0.0..=1.0).contains(&args.drop_cold_experts)) {
        return Err(UsageError(format!(
            "--drop-cold-experts {}: give a fraction in 0..=1 (0 is off; 0.75 skips missing \
             experts weighted below 0.75 x 1/k)",
            args.drop_cold_experts
        )));
    }
    // Each source's own flags need that source (clap's `requires` accepts any
    // member of the speculation group, so the pairing is checked here).
    let mtp_only = [
        ("--mtp-p-min", args.mtp_p_min.is_some()),
        ("--head-predemand", args.head_predemand),
    ];
    for (flag, given) in mtp_only {
        if given && !args.uses_mtp() {
            return Err(UsageError(format!("{flag} needs --mtp")));
        }
    }
    if args.ngram_min_match.is_some() && !args.uses_ngram() {
        return Err(UsageError(
            "--ngram-min-match needs --ngram or --spec ngram|auto".into(),
        ));
    }
    if args.route_trace.is_some() && args.resident {
        return Err(UsageError(
            "--route-trace records the streamed experts' demands; with --resident nothing is \
             streamed: drop one of them"
                .into(),
        ));
    }
    if args.route_trace.is_some() && args.uses_mtp() {
        return Err(UsageError(
            "--route-trace records the verify decodes only, and with --mtp (or --spec mtp|auto) \
             the head's demands share the cache, so a replay would not match the run: drop one of them"
                .into(),
        ));
    }
    if args.cache_warm != bmoe::stream::WarmSource::Off && args.resident {
        return Err(UsageError(
            "--cache-warm fills the streamed experts' cache; with --resident there is none: \
             drop one of them"
                .into(),
        ));
    }
    if args.head_predemand && args.resident {
        return Err(UsageError(
            "--head-predemand reads the MTP head's streamed experts early; with --resident \
             nothing is streamed: drop one of them"
                .into(),
        ));
    }
    Ok(())
}

/// The most prompt bytes bmoe reads (far beyond any context bmoe can hold).
const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// Read the prompt from a regular file, or from stdin for `-`, at most
/// `MAX_PROMPT_BYTES` (a FIFO, a device or /dev/zero would block or never end).
pub fn read_prompt_file(f: &Path) -> Result<String, UsageError> {
    use std::io::Read;
    if f != Path::new("-") {
        return read_text_file("the prompt file", f, ", or -f - to read stdin");
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| UsageError(format!("reading the prompt from stdin: {e}")))?;
    utf8_within_cap("the prompt on stdin", bytes)
}

/// `bytes` as text, refused when over the cap or not UTF-8.
fn utf8_within_cap(what: &str, bytes: Vec<u8>) -> Result<String, UsageError> {
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(UsageError(format!(
            "{what} is over {} MiB: bmoe reads at most that much",
            MAX_PROMPT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| UsageError(format!("{what} is not UTF-8 text ({e})")))
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

/// Read a text file given on the command line (a prompt, a cells file), at
/// most `MAX_PROMPT_BYTES`: a missing file, a directory, a FIFO or a device (never
/// opened, so never blocks), an oversized or non-UTF-8 file is refused with the
/// fix; `hint` ends the not-a-regular-file message.
pub fn read_text_file(what: &str, f: &Path, hint: &str) -> Result<String, UsageError> {
    use std::io::Read;
    let name = f.display();
    let meta = std::fs::metadata(f).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => UsageError(format!("{what} {name} does not exist")),
        _ => UsageError(format!("{what} {name}: {e}")),
    })?;
    if meta.is_dir() {
        return Err(UsageError(format!(
            "{what} {name} is a directory: give a text file"
        )));
    }
    if !meta.is_file() {
        return Err(UsageError(format!(
            "{what} {name} is not a regular file (a FIFO or a device): give a text file{hint}"
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(f)
        .and_then(|h| h.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| UsageError(format!("reading {what} {name}: {e}")))?;
    utf8_within_cap(&format!("{what} {name}"), bytes)
}

/// An output file a command is about to write: refused when it is one of
/// the run's `inputs` (it would be replaced) or exists as something other than
/// a regular file (a directory, a FIFO that would block, a device).
pub fn output_file(what: &str, out: &Path, inputs: &[&Path]) -> Result<(), UsageError> {
    refuse_output_over_input(what, out, inputs)?;
    match std::fs::metadata(out) {
        Ok(m) if !m.is_file() => Err(UsageError(format!(
            "{what} {} exists and is not a regular file: choose a file path",
            out.display()
        ))),
        _ => Ok(()),
    }
}

/// `bench -o`: a new or empty directory, or one without an earlier bench's
/// results (its runs would mix with this one's in the summary).
pub fn bench_out_dir(out: &Path) -> Result<(), UsageError> {
    let name = out.display();
    match std::fs::metadata(out) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_dir() => Err(UsageError(format!(
            "-o {name} is not a directory: give a directory for the bench's results (created if \
             missing)"
        ))),
        Ok(_) if out.join("summary.md").exists() || out.join("runs").exists() => {
            Err(UsageError(format!(
                "-o {name} already holds a bench's results (summary.md, runs/): give a new \
                 directory, or remove that one, so two benches' runs are not mixed"
            )))
        }
        Ok(_) => Ok(()),
    }
}

/// A prompt bmoe can use: not empty, and without a NUL byte under `--chat`
/// (the chat template takes C strings).
pub fn prompt_text(prompt: &str, chat: bool) -> Result<(), UsageError> {
    if prompt.is_empty() {
        return Err(UsageError(
            "the prompt is empty: give some text with -p or -f".into(),
        ));
    }
    if chat && prompt.contains('\0') {
        return Err(UsageError(
            "the prompt holds a NUL byte, which a chat template cannot carry: remove it, or drop \
             --chat"
                .into(),
        ));
    }
    Ok(())
}
