//! Flash faults on a real model, under both readers (io_uring over a faulty
//! ring, pread over a faulty source): transient faults (short reads, EAGAIN,
//! EINTR, slow and held-back completions) at seeded random points change
//! nothing; a persistent EIO stops the run with the error, after only correct
//! tokens, with an aborted CSV; never other text, a panic or a hang.

use bmoe::lab::compare::RunCsv;

use crate::common::{bmoe_within, e8k2, stderr, stdout, wait_within};

const PROMPT: &str = "Once upon a time";

fn run(extra: &[&str], csv: Option<&std::path::Path>) -> std::process::Output {
    let m = e8k2();
    let mut args = vec!["run", "-m", m.to_str().unwrap(), "-p", PROMPT, "-n", "32"];
    args.extend_from_slice(extra);
    let c;
    if let Some(p) = csv {
        c = p.to_str().unwrap().to_owned();
        args.extend(["--csv", c.as_str()]);
    }
    bmoe_within(&args, 180)
}

#[test]
fn transient_faults_at_random_points_change_no_token() {
    let resident = run(&["--resident"], None);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let want = stdout(&resident);
    let cells: [(u32, &str, &str, &[&str]); 4] = [
        (1, "0", "uring", &["--overlap"]),
        (2, "64", "pread", &["--overlap"]),
        (3, "16", "uring", &["--overlap", "--predict-prefetch"]),
        (4, "0", "uring", &["--prefetch", "2"]),
    ];
    for (seed, cache, reader, flags) in cells {
        let spec = format!(
            "seed={seed},short=0.05,eagain=0.05,eintr=0.05,slow=0.01,slow_ms=2,delay=0.3,\
             reader={reader}"
        );
        let mut args = vec!["--cache-mb", cache, "--inject-faults", &spec];
        args.extend_from_slice(flags);
        let o = run(&args, None);
        let err = stderr(&o);
        assert!(o.status.success(), "seed {seed}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(
            stdout(&o),
            want,
            "seed {seed}: text differs under transient faults"
        );
        let note = err
            .lines()
            .find(|l| l.contains("injected faults over"))
            .unwrap_or_else(|| panic!("no fault note: {err}"));
        assert!(
            !note.contains(" 0 short") && !note.contains(" 0 EAGAIN"),
            "{note}"
        );
    }
}

#[test]
fn a_persistent_read_error_stops_the_run_cleanly() {
    let resident = run(&["--resident"], None);
    let want = stdout(&resident);
    let dir = tempfile::tempdir().unwrap();
    let cells: [(u32, &str, &str, &[&str]); 3] = [
        (2, "0", "uring", &[]),
        (5, "0", "pread", &[]),
        (6, "16", "uring", &["--overlap", "--predict-prefetch"]),
    ];
    for (seed, cache, reader, flags) in cells {
        let csv = dir.path().join(format!("eio-{seed}.csv"));
        let spec = format!("seed={seed},eio=0.002,delay=0.3,short=0.05,reader={reader}");
        let mut args = vec!["--cache-mb", cache, "--inject-faults", &spec];
        args.extend_from_slice(flags);
        let o = run(&args, Some(&csv));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "seed {seed}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.starts_with("error:") && last.contains("Input/output error"),
            "the first error is the one reported: {last}"
        );
        // Every token printed before the stop is the resident run's.
        let got = stdout(&o);
        let got = got.trim_end_matches('\n');
        assert!(
            want.starts_with(got),
            "seed {seed}: {got:?} is not a prefix of {want:?}"
        );
        let c = RunCsv::open(&csv).expect("the CSV of a failed run parses");
        assert!(c.aborted(), "seed {seed}: trailer {:?}", c.trailer);
        assert_eq!(c.trailer["aborted"], "1");
        // A failed run still says what it did: BMOE_DONE with aborted=1 and the
        // trailer's token count.
        let done = err
            .lines()
            .find(|l| l.starts_with("BMOE_DONE {"))
            .unwrap_or_else(|| panic!("seed {seed}: no BMOE_DONE in {err}"));
        assert!(done.contains("\"aborted\":1"), "{done}");
        assert!(
            done.contains(&format!("\"tokens\":{},", c.trailer["tokens"])),
            "{done} vs {:?}",
            c.trailer
        );
    }
}

#[test]
fn a_panicking_flash_actor_stops_the_run_without_a_hang() {
    let o = run(
        &["--cache-mb", "0", "--inject-faults", "seed=4,panic=0.002"],
        None,
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("injected panic in the flash reader"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error:") && last.contains("the flash actor has stopped"),
        "{last}"
    );
}

#[test]
fn a_bad_fault_spec_is_a_usage_error() {
    let o = run(&["--inject-faults", "eio=2"], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("probability"), "{}", stderr(&o));
}

/// Start a 200-token streamed run of `model` with --progress, wait for its
/// first token, do `change` to the file, and return (exit code, stdout lines
/// after the first, stderr). Fails the test when the run does not end within 120 s.
fn change_model_while_running(
    model: &std::path::Path,
    dense: &str,
    change: impl FnOnce(),
) -> (Option<i32>, Vec<String>, String) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            PROMPT,
            "-n",
            "200",
            "--cache-mb",
            "0",
            "--dense-weights",
            dense,
            "--progress",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a progress line").unwrap();
    assert!(first.starts_with("BMOE_PROGRESS"), "{first}");
    change();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = wait_within(
        &mut child,
        120,
        "the run after the change to the model file",
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), rest, err)
}

#[test]
fn a_model_truncated_while_running_stops_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("model.gguf");
    // With the dense weights in anonymous memory only the expert reads touch
    // the file: the flash actor notices the truncation. With them left in
    // llama.cpp's mapping a dense page past the new end raises SIGBUS, which
    // the binary turns into the same clear error (whichever comes first).
    for dense in ["anon", "mmap"] {
        std::fs::copy(e8k2(), &copy).unwrap();
        let (code, rest, err) = change_model_while_running(&copy, dense, || {
            let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
            f.set_len(64 << 20).unwrap();
        });
        assert_eq!(code, Some(1), "{dense}: {err}");
        assert!(err.contains("truncated"), "{dense}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            rest.len() < 199,
            "the run stopped early ({} more lines)",
            rest.len()
        );
        let done = rest.iter().find(|l| l.starts_with("BMOE_DONE"));
        assert!(done.is_none_or(|d| d.contains("\"aborted\":1")), "{done:?}");
    }
}

#[test]
fn a_model_replaced_while_running_is_detected_and_the_run_stops() {
    // A hard link in the fixture's own directory (same filesystem): renaming
    // another file over the link leaves the shared fixture untouched.
    let dir = tempfile::tempdir_in(e8k2().parent().unwrap()).unwrap();
    let link = dir.path().join("model.gguf");
    std::fs::hard_link(e8k2(), &link).unwrap();
    let (code, rest, err) = change_model_while_running(&link, "warm", || {
        let other = dir.path().join("other.gguf");
        std::fs::write(&other, b"GGUF not really").unwrap();
        std::fs::rename(&other, &link).unwrap();
    });
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("was replaced (the path names another file now)"),
        "{err}"
    );
    assert!(err.contains("restart bmoe"), "{err}");
    let done = rest
        .iter()
        .find(|l| l.starts_with("BMOE_DONE"))
        .unwrap_or_else(|| panic!("BMOE_DONE on stdout with --progress: {rest:?}"));
    assert!(done.contains("\"aborted\":1"), "{done}");
    assert!(rest.len() < 199, "the run stopped early");
}

#[test]
fn a_csv_write_failing_mid_run_stops_generation_with_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    // The limit lets the preamble and ~20 rows through.
    let (code, err) = run_with_file_size_limit(&["--csv", csv.to_str().unwrap()], 2048);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("writing the CSV") && err.contains("File too large"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert!(rows > 0 && rows < 64, "{rows} rows before the failure");
    let done = err
        .lines()
        .find(|l| l.starts_with("BMOE_DONE {"))
        .unwrap_or_else(|| panic!("no BMOE_DONE in {err}"));
    assert!(done.contains("\"aborted\":1"), "{done}");
    let tokens: usize = done
        .split("\"tokens\":")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(tokens < 64, "generation stopped early: {done}");
}

#[test]
fn a_panicking_eval_observer_aborts_the_decode_and_fails_the_run_with_the_panic() {
    let want = stdout(&run(&["--resident"], None));
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("panic.csv");
    // Past the prompt's decode, inside the generated tokens.
    let o = run(
        &[
            "--cache-mb",
            "0",
            "--inject-faults",
            "observer_panic_at=200",
        ],
        Some(&csv),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error:")
            && last.contains("eval observer panicked")
            && last.contains("injected panic in the eval observer"),
        "the panic is the error reported: {last}"
    );
    let got = stdout(&o);
    let got = got.trim_end_matches('\n');
    assert!(!got.is_empty(), "the panic came after some tokens: {err}");
    assert!(
        want.starts_with(got) && got.len() < want.trim_end().len(),
        "only tokens before the failing one: {got:?} vs {want:?}"
    );
    let c = RunCsv::open(&csv).expect("the CSV of a failed run parses");
    assert!(c.aborted(), "trailer {:?}", c.trailer);
}

/// A streamed (cache 0) E8K2 run of `n` tokens with `extra`, stdout to
/// `stdout`, stderr piped.
fn streamed_run(n: &str, extra: &[&str], stdout: std::process::Stdio) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"));
    cmd.args(["run", "-m", e8k2().to_str().unwrap(), "-p", PROMPT, "-n", n])
        .args(["--cache-mb", "0"])
        .args(extra)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped());
    cmd
}

/// A 64-token streamed E8K2 run with `extra`, under a file size limit of
/// `limit` bytes (writes past it raise SIGXFSZ, which bmoe ignores so that
/// they fail with EFBIG). Returns the exit code and stderr.
fn run_with_file_size_limit(extra: &[&str], limit: u64) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = streamed_run("64", extra, std::process::Stdio::piped());
    // SAFETY: runs in the forked child before exec; setrlimit is
    // async-signal-safe and touches no state of the parent.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SIGXFSZ keeps its default (kill) here: bmoe must ignore it itself.
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    finish(cmd.spawn().unwrap(), "the run under a file size limit")
}

#[test]
fn a_trace_that_cannot_be_written_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let (code, err) = run_with_file_size_limit(&["--trace-chrome", trace.to_str().unwrap()], 4096);
    assert_eq!(code, Some(1), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error:")
            && last.contains("writing the trace")
            && last.contains("File too large"),
        "{last}"
    );
}

/// A short streamed E8K2 run whose stdout goes to `stdout`, with `extra`.
fn run_to(stdout: std::process::Stdio, extra: &[&str]) -> std::process::Child {
    streamed_run("32", extra, stdout).spawn().unwrap()
}

fn finish(mut child: std::process::Child, what: &str) -> (Option<i32>, String) {
    let status = wait_within(&mut child, 120, what);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked"), "{what}: {err}");
    (status.code(), err)
}

#[test]
fn a_closed_or_full_stdout_stops_the_run_with_exit_1() {
    use std::process::Stdio;
    let full = || {
        Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("full.csv");
    // The text to a full disk: stopped, said, the CSV marked aborted.
    let (code, err) = finish(
        run_to(full(), &["--csv", csv.to_str().unwrap()]),
        "text to /dev/full",
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("writing to stdout failed") && err.contains("No space left"),
        "{err}"
    );
    let c = RunCsv::open(&csv).unwrap();
    assert!(c.aborted(), "{:?}", c.trailer);
    assert!(err.contains("\"aborted\":1"), "BMOE_DONE on stderr: {err}");
    // Progress lines to a full disk.
    let (code, err) = finish(run_to(full(), &["--progress"]), "progress to /dev/full");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("writing BMOE_PROGRESS lines to stdout failed"),
        "{err}"
    );
    // A reader that goes away after 10 bytes (`| head -c 10`).
    let mut child = run_to(Stdio::piped(), &[]);
    let mut out = child.stdout.take().unwrap();
    let mut ten = [0u8; 10];
    std::io::Read::read_exact(&mut out, &mut ten).unwrap();
    drop(out);
    let (code, err) = finish(child, "stdout closed after 10 bytes");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("Broken pipe"), "{err}");
    // Other commands: an error, not a panic.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["inspect", e8k2().to_str().unwrap()])
        .stdout(full())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("writing to stdout failed"),
        "{}",
        stderr(&o)
    );
}
