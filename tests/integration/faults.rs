//! Flash faults on a real model: transient faults (short reads, EAGAIN, slow
//! reads) at seeded random points change nothing; a persistent EIO stops the run
//! with the error, after only correct tokens, with an aborted CSV; never a panic
//! or a hang.

use bmoe::compare::RunCsv;

use crate::common::{bmoe_within, e8k2, stderr, stdout};

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
    for (seed, cache) in [(1, "0"), (2, "64"), (3, "0")] {
        let spec = format!("seed={seed},short=0.05,eagain=0.05,slow=0.01,slow_ms=2");
        let o = run(
            &["--cache-mb", cache, "--overlap", "--inject-faults", &spec],
            None,
        );
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
    for seed in [2, 5] {
        let csv = dir.path().join(format!("eio-{seed}.csv"));
        let spec = format!("seed={seed},eio=0.002");
        let o = run(&["--cache-mb", "0", "--inject-faults", &spec], Some(&csv));
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

#[test]
fn a_model_truncated_while_running_stops_the_run_cleanly() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("model.gguf");
    std::fs::copy(e8k2(), &copy).unwrap();
    // Dense weights in anonymous memory: after the prefill nothing but the
    // expert reads touches the file (a mapped page past a new end of file
    // would be SIGBUS, which docs/reliability.md lists as not handled).
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args([
            "run",
            "-m",
            copy.to_str().unwrap(),
            "-p",
            PROMPT,
            "-n",
            "200",
            "--cache-mb",
            "0",
            "--dense-weights",
            "anon",
            "--progress",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a progress line").unwrap();
    assert!(first.starts_with("BMOE_PROGRESS"), "{first}");
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed().as_secs() < 120, "no exit after the truncation");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("truncated or replaced while running"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        rest.len() < 199,
        "the run stopped early ({} more lines)",
        rest.len()
    );
    let done = rest.iter().find(|l| l.starts_with("BMOE_DONE"));
    assert!(done.is_none_or(|d| d.contains("\"aborted\":1")), "{done:?}");
}
