//! Issue 66: given no streaming flag, a model whose file fits in memory runs
//! resident (llama.cpp's mmap, as `--resident`), one that does not streams
//! with `--cache-mb auto`; any streaming flag keeps it streamed. And the
//! forecast's compute probe (`inspect --forecast --compute-probe depth`).

use std::process::{Command, Output};

use crate::common::{e8k2, smollm2, stderr, stdout};

const PROMPT: &str = "The capital of France is";

/// `bmoe run -m E8K2 -p PROMPT -n 6 EXTRA...` with MemAvailable faked to
/// `fake` bytes for the decision (None: the host's).
fn run(extra: &[&str], fake: Option<u64>) -> Output {
    let m = e8k2().to_str().unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_bmoe"));
    c.args(["run", "-m", m, "-p", PROMPT, "-n", "6"])
        .args(extra)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .env_remove("BMOE_FAKE_MEM_AVAILABLE_BYTES");
    if let Some(f) = fake {
        c.env("BMOE_FAKE_MEM_AVAILABLE_BYTES", f.to_string());
    }
    c.output().expect("start bmoe")
}

/// The run's `BMOE_DONE` object.
fn done(err: &str) -> serde_json::Value {
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("BMOE_DONE "))
        .unwrap_or_else(|| panic!("no BMOE_DONE in\n{err}"));
    serde_json::from_str(line).expect("BMOE_DONE is JSON")
}

#[test]
fn a_model_that_fits_runs_resident_unless_a_streaming_flag_is_given() {
    let o = run(&[], None);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("in memory (")).collect();
    assert_eq!(said.len(), 1, "the decision is said once: {err}");
    assert!(
        said[0].starts_with("bmoe: the model (") && said[0].contains("fits in memory"),
        "{err}"
    );
    assert!(
        said[0].contains("running resident; --cache-mb auto streams it"),
        "{err}"
    );
    let d = done(&err);
    assert_eq!(d["mode"], "resident", "{err}");
    assert_eq!(d["read_bytes_total"], 0, "no expert reads: {err}");
    assert_eq!(
        d["cache_hits"].as_u64().unwrap() + d["cache_misses"].as_u64().unwrap(),
        0
    );
    assert!(!err.contains("moe-cache:"), "nothing streamed: {err}");
    let resident = stdout(&o);

    // Any streaming flag keeps it streamed, `--cache-mb auto` (the default
    // value) included; no decision is said.
    for flags in [
        &["--cache-mb", "auto"][..],
        &["--moe-stream"],
        &["--overlap"],
    ] {
        let o = run(flags, None);
        let err = stderr(&o);
        assert!(o.status.success(), "{flags:?}: {err}");
        assert!(!err.contains("in memory ("), "{flags:?}: {err}");
        let d = done(&err);
        assert_eq!(d["mode"], "stream", "{flags:?}: {err}");
        assert!(
            d["read_bytes_total"].as_u64().unwrap() > 0,
            "{flags:?}: {err}"
        );
        assert!(err.contains("moe-cache: budget"), "{flags:?}: {err}");
        assert_eq!(stdout(&o), resident, "{flags:?}: streaming is lossless");
    }
    let o = run(&["--resident"], None);
    assert!(!stderr(&o).contains("in memory ("), "{}", stderr(&o));
    assert_eq!(done(&stderr(&o))["mode"], "resident");
}

#[test]
fn a_model_that_does_not_fit_streams_with_the_auto_budget() {
    let file = std::fs::metadata(e8k2()).unwrap().len();
    // MemAvailable below the file: it cannot fit.
    let o = run(&[], Some(file / 2));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("in memory (")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("does not fit in memory"), "{err}");
    assert!(
        said[0].contains("streaming its experts with --cache-mb auto"),
        "{err}"
    );
    let d = done(&err);
    assert_eq!(d["mode"], "stream", "{err}");
    assert!(d["read_bytes_total"].as_u64().unwrap() > 0, "{err}");
    assert!(err.contains("--cache-mb auto ="), "the auto budget: {err}");
    // The file alone fits, but not with the 1 GiB margin.
    let o = run(&[], Some(file + (512 << 20)));
    let err = stderr(&o);
    assert!(err.contains("does not fit in memory"), "{err}");
    assert_eq!(done(&err)["mode"], "stream");
}

#[test]
fn inspect_forecast_measures_compute_from_the_model_cut_to_two_depths() {
    let m = e8k2().to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["inspect", m, "--forecast", "--probe-seconds", "0.3"])
        .args(["--probe-tokens", "4", "--compute-probe", "depth", "-t", "2"])
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("start bmoe");
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(o.status.success(), "{err}");
    println!("{out}");
    let line = out
        .lines()
        .find(|l| l.contains("compute probe:"))
        .unwrap_or_else(|| panic!("no compute probe line in\n{out}"));
    assert!(line.contains("cut to 2 blocks"), "{line}");
    assert!(line.contains(", 4 blocks"), "{line}");
    assert!(
        line.contains("x 30 blocks = compute"),
        "E8K2 has 30: {line}"
    );
    let ms = |after: &str| -> f64 {
        line.split(after)
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        ms("cut to 2 blocks ") > 0.0 && ms(", 4 blocks ") > 0.0,
        "{line}"
    );
    // Under a busy host the deeper cut can run no faster than the shallow
    // one; the forecast then says so and keeps the decode probe's compute.
    // (The times are printed to 0.01 ms, so a verdict is checked against
    // them where they differ.)
    let (two, four) = (ms("cut to 2 blocks "), ms(", 4 blocks "));
    if line.contains("the cells below use it") {
        assert!(four >= two, "{line}");
        assert!(ms("= compute ") >= four, "{line}");
        assert!(out.contains("its compute is the compute probe's"), "{out}");
    } else {
        assert!(
            line.contains("not used: the deeper cut ran no slower"),
            "{line}"
        );
        assert!(four <= two, "{line}");
        assert!(!out.contains("its compute is the compute probe's"), "{out}");
    }
    // The copies were removed.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // Fewer than two depths, or one past the model's blocks, is refused.
    for bad in ["4", "2,31"] {
        let o = crate::common::bmoe(&[
            "inspect",
            m,
            "--forecast",
            "--compute-probe",
            "depth",
            "--depth-blocks",
            bad,
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("--depth-blocks"), "{}", stderr(&o));
    }
}

/// `bmoe serve -m E8K2 EXTRA...`: its stderr up to the line that says it
/// listens (then it is killed).
fn serve_start_log(extra: &[&str]) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let m = e8k2().to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["serve", "-m", m, "--port", "0", "-t", "2", "-c", "512"])
        .args(["--prompt-cache", "off"])
        .args(extra)
        .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
        .env_remove("RUST_LOG")
        .env_remove("BMOE_FAKE_MEM_AVAILABLE_BYTES")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe serve");
    let mut lines = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        let done = line.contains("listening on http://");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn serve_takes_the_same_default() {
    let log = serve_start_log(&[]);
    assert!(log.iter().any(|l| l.contains("listening on")), "{log:#?}");
    let said: Vec<_> = log.iter().filter(|l| l.contains("in memory (")).collect();
    assert_eq!(said.len(), 1, "{log:#?}");
    assert!(said[0].contains("running resident"), "{log:#?}");
    let log = serve_start_log(&["--cache-mb", "auto"]);
    assert!(log.iter().any(|l| l.contains("listening on")), "{log:#?}");
    assert!(!log.iter().any(|l| l.contains("in memory (")), "{log:#?}");
}
