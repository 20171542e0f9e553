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
fn a_bad_fault_spec_is_a_usage_error() {
    let o = run(&["--inject-faults", "eio=2"], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("probability"), "{}", stderr(&o));
}
