//! The first SIGINT/SIGTERM stops bmoe within about a second wherever a user
//! waits: a long prefill, a fixture build, the read probe (the decode loop's
//! token-boundary stop is in telemetry.rs).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{e8k2, names_in, smollm2};

/// How long bmoe may take to stop after the signal (a decode step or a
/// graph node, plus process teardown, on a loaded 2-core host).
const STOP_WITHIN: Duration = Duration::from_secs(3);

fn spawn(args: &[&str], cache: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .env("BMOE_CACHE_DIR", cache)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe")
}

/// Wait until `ready` holds (at most `limit`), send SIGINT, and return the
/// exit code, stderr and how long bmoe took to stop after the signal.
fn interrupt_when(
    mut child: Child,
    limit: Duration,
    ready: impl Fn() -> bool,
) -> (Option<i32>, String, Duration) {
    let t0 = Instant::now();
    while !ready() {
        assert!(t0.elapsed() < limit, "never got ready to interrupt");
        if let Ok(Some(s)) = child.try_wait() {
            panic!("bmoe ended before the signal: {s}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let signalled = Instant::now();
    let deadline = signalled + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "bmoe ignored SIGINT for 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = signalled.elapsed();
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

#[test]
fn a_long_prefill_stops_within_a_second_or_so() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("pre.csv");
    // ~4,000 tokens: tens of seconds of streamed prefill on this host.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(400);
    let prompt_file = dir.path().join("long.txt");
    std::fs::write(&prompt_file, prompt).unwrap();
    let child = spawn(
        &[
            "run",
            "-m",
            e8k2().to_str().unwrap(),
            "-f",
            prompt_file.to_str().unwrap(),
            "-c",
            "8192",
            "-n",
            "4",
            "--cache-mb",
            "0",
            "--csv",
            csv.to_str().unwrap(),
        ],
        smollm2().parent().unwrap(),
    );
    // Interrupt once the prefill is under way: the first batch's decode
    // started, which the trace shows as bytes read; a fixed delay is simpler
    // and enough (the load takes well under this, the prefill far more).
    let started = Instant::now();
    let (code, err, took) = interrupt_when(child, Duration::from_secs(60), || {
        started.elapsed() > Duration::from_secs(4)
    });
    assert_eq!(code, Some(130), "{err}");
    assert!(took < STOP_WITHIN, "stopped {took:?} after SIGINT\n{err}");
    assert!(
        !err.contains("ERROR"),
        "a deliberate stop shows no llama.cpp error lines: {err}"
    );
    assert!(
        !err.contains("prefill: 0 tokens"),
        "the summary does not contradict the prefill time it shows: {err}"
    );
    let text = std::fs::read_to_string(&csv).expect("the CSV is in place");
    assert!(
        text.contains("aborted=1") || text.contains("aborted,1"),
        "{text}"
    );
}

#[test]
fn a_fixture_build_stops_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("big.gguf");
    let child = spawn(
        &[
            "fixture",
            "upcycle",
            "--from",
            smollm2().to_str().unwrap(),
            "--experts",
            "64",
            "--top-k",
            "2",
            "-o",
            out.to_str().unwrap(),
        ],
        smollm2().parent().unwrap(),
    );
    // Interrupt once the temporary file has grown (the build is under way).
    let d = dir.path().to_path_buf();
    let (code, err, took) = interrupt_when(child, Duration::from_secs(60), || {
        std::fs::read_dir(&d).unwrap().any(|e| {
            let e = e.unwrap();
            e.file_name().to_string_lossy().ends_with(".partial")
                && e.metadata().map(|m| m.len() > (64 << 20)).unwrap_or(false)
        })
    });
    assert_eq!(code, Some(130), "{err}");
    assert!(took < STOP_WITHIN, "stopped {took:?} after SIGINT\n{err}");
    let left = names_in(dir.path());
    assert!(
        left.iter()
            .all(|f| !f.ends_with(".partial") && f != "big.gguf"),
        "nothing half-built is left: {left:?}"
    );
}

#[test]
fn the_read_probe_stops_between_reads() {
    let child = spawn(
        &[
            "probe",
            "-m",
            e8k2().to_str().unwrap(),
            "--depths",
            "1,2,4,8",
            "--seconds",
            "10",
        ],
        smollm2().parent().unwrap(),
    );
    let started = Instant::now();
    let (code, err, took) = interrupt_when(child, Duration::from_secs(60), || {
        started.elapsed() > Duration::from_millis(1500)
    });
    assert_eq!(code, Some(130), "{err}");
    assert!(took < STOP_WITHIN, "stopped {took:?} after SIGINT\n{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_signal_during_model_load_stops_the_run() {
    // The signal lands while bmoe opens, checks and loads the model (or, on a
    // fast host, right after): either way it stops at once with 130.
    for delay_ms in [150u64, 400, 800] {
        let child = spawn(
            &[
                "run",
                "-m",
                e8k2().to_str().unwrap(),
                "-p",
                "Once upon a time",
                "-n",
                "100000",
                "--ignore-eos",
            ],
            smollm2().parent().unwrap(),
        );
        let started = Instant::now();
        let (code, err, took) = interrupt_when(child, Duration::from_secs(30), || {
            started.elapsed() > Duration::from_millis(delay_ms)
        });
        assert_eq!(code, Some(130), "after {delay_ms} ms: {err}");
        assert!(
            took < STOP_WITHIN,
            "after {delay_ms} ms: stopped {took:?} after SIGINT\n{err}"
        );
    }
}

/// SIGTERM during a long chat template render (`run --show-prompt`, once
/// ignored until the render ended) stops bmoe promptly with 143, and no
/// prompt is printed.
#[test]
fn sigterm_stops_a_long_template_render() {
    let dir = tempfile::tempdir().unwrap();
    let t = crate::chat::template_file(dir.path(), "slow", crate::chat::SLOW_TEMPLATE);
    let m = smollm2();
    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "--chat",
        "-p",
        "Hi",
        "--show-prompt",
    ];
    let mut child = spawn(
        &[&args[..], &["--chat-template-file", &t]].concat(),
        m.parent().unwrap(),
    );
    // The vocabulary loads in well under a second; the render then takes minutes.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().expect("wait").is_none(), "still rendering");
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let signalled = Instant::now();
    let status = crate::common::wait_within(&mut child, 30, "bmoe after SIGTERM mid-render");
    assert!(
        signalled.elapsed() < STOP_WITHIN,
        "{:?}",
        signalled.elapsed()
    );
    let out = child.wait_with_output().expect("output");
    assert_eq!(
        status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "no prompt printed");
}
