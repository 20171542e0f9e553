//! The CSV contract and the BMOE_DONE line on real runs.

use std::collections::HashMap;

use crate::common::{bmoe, e8k2, e8k2_cli, stderr, stdout};

struct Csv {
    preamble: HashMap<String, String>,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
    trailer: HashMap<String, String>,
}

fn parse(text: &str) -> Csv {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("# bmoe_metrics"));
    let mut preamble = HashMap::new();
    let mut columns = Vec::new();
    for l in lines.by_ref() {
        match l.strip_prefix("# ") {
            Some(kv) => {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("key=value: {l}"));
                preamble.insert(k.to_string(), v.to_string());
            }
            None => {
                columns = l.split(',').map(String::from).collect();
                break;
            }
        }
    }
    let mut rows = Vec::new();
    let mut trailer = HashMap::new();
    let mut in_trailer = false;
    for l in lines {
        if l == "# summary" {
            in_trailer = true;
        } else if in_trailer {
            let (k, v) = l.trim_start_matches("# ").split_once('=').unwrap();
            trailer.insert(k.to_string(), v.to_string());
        } else {
            rows.push(l.split(',').map(String::from).collect::<Vec<_>>());
        }
    }
    Csv {
        preamble,
        columns,
        rows,
        trailer,
    }
}

fn col_sum(c: &Csv, name: &str) -> u64 {
    let i = c.columns.iter().position(|x| x == name).unwrap();
    c.rows.iter().map(|r| r[i].parse::<u64>().unwrap()).sum()
}

fn done_value(line: &str, key: &str) -> String {
    let k = format!("\"{key}\":");
    let i = line.find(&k).unwrap_or_else(|| panic!("{key} in {line}")) + k.len();
    line[i..].split([',', '}']).next().unwrap().to_string()
}

#[test]
fn csv_rows_trailer_and_done_line_agree() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("stream", vec!["--cache-mb", "64"]),
        ("resident", vec!["--resident"]),
        (
            "stream-prefetch",
            vec![
                "--cache-mb",
                "0",
                "--overlap",
                "--prefetch",
                "1",
                "--predict-prefetch",
            ],
        ),
        (
            "stream-lossy",
            vec![
                "--cache-mb",
                "0",
                "--drop-cold-experts",
                "0.75",
                "--n-expert-used",
                "1",
            ],
        ),
    ] {
        let csv = dir.path().join(format!("{name}.csv"));
        let mut args = vec![
            "run",
            "-m",
            e8k2().to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "12",
        ];
        args.extend(extra.iter().copied());
        let csv_s = csv.to_str().unwrap().to_string();
        args.extend(["--csv", &csv_s]);
        let o = bmoe(&args);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let c = parse(&std::fs::read_to_string(&csv).unwrap());
        // Every resolved flag is in the preamble.
        for k in [
            "engine_version",
            "model",
            "arch",
            "n_layer",
            "n_expert",
            "n_expert_used",
            "threads",
            "n_ctx",
            "n_ubatch",
            "mode",
            "cache_mb",
            "io_threads",
            "o_direct",
            "overlap",
            "prefetch",
            "predict_prefetch",
            "dense_weights",
            "drop_cold_frac",
            "n_expert_used_model",
            "lossy",
            "spec",
            "spec_draft_max",
        ] {
            assert!(c.preamble.contains_key(k), "{name}: preamble lacks {k}");
        }
        assert_eq!(c.preamble["mode"], name.split('-').next().unwrap());
        assert_eq!(
            c.preamble["lossy"],
            if name == "stream-lossy" { "1" } else { "0" }
        );
        if name == "stream-prefetch" {
            assert_eq!(c.preamble["prefetch"], "1");
            assert_eq!(c.preamble["predict_prefetch"], "1");
            assert_eq!(c.preamble["overlap"], "1");
        }
        assert_eq!(c.columns.len(), bmoe_decode::telemetry::COLUMNS.len());
        // One row per generated token.
        let generated: usize = err
            .lines()
            .find(|l| l.starts_with("generation:"))
            .and_then(|l| l.split(", ").nth(1))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(c.rows.len(), generated, "{name}");
        assert_eq!(c.trailer["tokens"], generated.to_string());
        // Bytes add up: rows = trailer = BMOE_DONE.
        let done = err
            .lines()
            .find(|l| l.starts_with("BMOE_DONE "))
            .expect("BMOE_DONE line");
        let total = col_sum(&c, "read_bytes");
        assert_eq!(c.trailer["read_bytes_total"], total.to_string());
        assert_eq!(done_value(done, "read_bytes_total"), total.to_string());
        assert_eq!(c.trailer["aborted"], "0");
        for key in ["prefetch_bytes", "dropped_experts"] {
            let sum = col_sum(&c, key);
            assert_eq!(c.trailer[key], sum.to_string(), "{name}: {key}");
            assert_eq!(done_value(done, key), sum.to_string(), "{name}: {key}");
        }
        if name.starts_with("stream") {
            assert!(total > 0);
        }
        // `bmoe compare` reads every mode's CSV.
        let cmp = bmoe(&["compare", csv.to_str().unwrap()]);
        assert!(cmp.status.success(), "{}", stderr(&cmp));
    }
}

#[test]
fn progress_prints_json_lines_and_done_on_stdout() {
    let o = e8k2_cli("Once upon a time", 4, &["--progress", "--cache-mb", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let progress: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("BMOE_PROGRESS {"))
        .collect();
    assert_eq!(progress.len(), 4, "{out}");
    assert!(progress[1].contains("\"stall_ms\":") && progress[1].contains("\"text\":\""));
    assert!(out.lines().any(|l| l.starts_with("BMOE_DONE {")), "{out}");
}

#[test]
fn an_unwritable_csv_is_refused_before_the_model_loads() {
    let o = bmoe(&[
        "run",
        "-m",
        "/nonexistent/model.gguf",
        "-p",
        "x",
        "--csv",
        "/nonexistent-dir/m.csv",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("writable --csv"), "{}", stderr(&o));
}

#[test]
fn an_interrupted_run_keeps_its_csv_with_an_aborted_trailer() {
    // SIGINT -> 130, SIGTERM -> 143, SIGHUP (the terminal closed) -> 129, and
    // a second SIGINT right after the first still ends the run (at once, by
    // the handler) with 130.
    for (sig, twice, code) in [
        (libc::SIGINT, false, 130),
        (libc::SIGTERM, false, 143),
        (libc::SIGHUP, false, 129),
        (libc::SIGINT, true, 130),
    ] {
        interrupted_run(sig, twice, code);
    }
}

fn interrupted_run(sig: i32, twice: bool, code: i32) {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("int.csv");
    let child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args([
            "run",
            "-m",
            e8k2().to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "100000",
        ])
        .args([
            "--cache-mb",
            "0",
            "-c",
            "4096",
            "--csv",
            csv.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a few rows are on disk (in the CSV's temporary file beside it,
    // renamed into place when the run ends), then interrupt.
    let partial = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains(".int.csv.bmoe-"))
    };
    let t0 = Instant::now();
    loop {
        let rows = partial()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| t.lines().filter(|l| !l.starts_with('#')).count())
            .unwrap_or(0);
        if rows >= 4 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no rows appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, sig) };
    if twice {
        // SAFETY: as above.
        unsafe { libc::kill(child.id() as i32, sig) };
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "signal {sig}: {err}");
    assert!(partial().is_none(), "the CSV was moved into place");
    if twice {
        // Exited from the handler: the CSV has its rows, maybe no trailer.
        let text = std::fs::read_to_string(&csv).expect("the CSV is in place");
        assert!(text.lines().filter(|l| !l.starts_with('#')).count() >= 4);
        return;
    }
    let c = parse(&std::fs::read_to_string(&csv).unwrap());
    assert_eq!(c.trailer["aborted"], "1");
    assert_eq!(c.trailer["tokens"], c.rows.len().to_string());
    assert!(err.contains("(interrupted)"), "{err}");
    let done = err
        .lines()
        .find(|l| l.starts_with("BMOE_DONE "))
        .expect("BMOE_DONE");
    assert_eq!(done_value(done, "aborted"), "1");
}

#[test]
fn compare_puts_runs_side_by_side_and_refuses_mixed_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (name, cache) in [("a", "0"), ("b", "64")] {
        let csv = dir.path().join(format!("{name}.csv"));
        let o = e8k2_cli(
            "Once upon a time",
            10,
            &["--cache-mb", cache, "--csv", csv.to_str().unwrap()],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        paths.push(csv);
    }
    let a = paths[0].to_str().unwrap();
    let b = paths[1].to_str().unwrap();
    let o = bmoe(&["compare", a, b]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("tok/s [95% CI]"), "{out}");
    assert!(out.contains(&format!("1: {a} cache_mb=0")), "{out}");
    assert!(out.contains(&format!("2: {b} cache_mb=64")), "{out}");
    assert!(
        !out.contains("io_threads="),
        "only differing keys in the legend: {out}"
    );
    let row = out.lines().find(|l| l.starts_with("| 1 |")).expect("row 1");
    // MiB/token of the cache-0 run: 30 layers x top-2 x 3 x 552960 B = 94.92 MiB.
    assert!(row.contains("| 94.92 |"), "{row}");
    // A speculated run is not compared with a plain one without --mixed.
    let spec = dir.path().join("spec.csv");
    let text = std::fs::read_to_string(&paths[1])
        .unwrap()
        .replace("# spec=off", "# spec=ngram");
    std::fs::write(&spec, text).unwrap();
    let o = bmoe(&["compare", a, spec.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--mixed"), "{}", stderr(&o));
    let o = bmoe(&["compare", a, spec.to_str().unwrap(), "--mixed"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Not a telemetry CSV: a clear error naming the file and line.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "hello\n").unwrap();
    let o = bmoe(&["compare", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.csv:1"), "{}", stderr(&o));
    // A row with NaN or a negative time is refused, naming the line.
    let first_row = |t: &str| t.lines().position(|l| l.starts_with("1,")).unwrap() + 1;
    let text = std::fs::read_to_string(&paths[0]).unwrap();
    for (name, value) in [("nan.csv", "NaN"), ("neg.csv", "-5")] {
        let n = first_row(&text);
        let p = dir.path().join(name);
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let mut fields: Vec<&str> = lines[n - 1].split(',').collect();
        fields[1] = value; // wall_ms
        lines[n - 1] = fields.join(",");
        std::fs::write(&p, lines.join("\n")).unwrap();
        let o = bmoe(&["compare", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{name}:{n}")),
            "{}",
            stderr(&o)
        );
    }
}

/// The `decode X tok/s` and `N generated` of the summary line.
fn summary_rate_and_count(err: &str) -> (f64, u64) {
    let line = err
        .lines()
        .find(|l| l.starts_with("generation:"))
        .unwrap_or_else(|| panic!("no generation line in {err}"));
    let count = line.split(" generated").next().unwrap();
    let count = count.rsplit(' ').next().unwrap().parse().unwrap();
    let rate = line.split("decode ").nth(1).unwrap();
    let rate = rate.split(' ').next().unwrap().parse().unwrap();
    (rate, count)
}

/// A key of the BMOE_DONE line in `err`.
fn done_in(err: &str, key: &str) -> String {
    let done = err
        .lines()
        .find(|l| l.starts_with("BMOE_DONE {"))
        .unwrap_or_else(|| panic!("no BMOE_DONE in {err}"));
    done_value(done, key)
}

#[test]
fn ignore_eos_runs_to_n_and_the_summary_and_done_line_agree() {
    let m = e8k2();
    let question = "What is the capital of France?";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", m.to_str().unwrap(), "-p", question, "-n", "12"];
        args.extend_from_slice(extra);
        crate::common::bmoe_within(&args, 120)
    };
    // Without --chat this model ends its text at once: 0 tokens, and the
    // summary says so without negative zeros or made-up rates.
    let o = run(&[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("-0.0"), "no negative zero: {err}");
    assert_eq!(summary_rate_and_count(&err), (0.0, 0), "{err}");
    assert_eq!(done_in(&err, "tokens"), "0");
    // --ignore-eos: exactly -n tokens; one decode rate in both places.
    let o = run(&["--ignore-eos"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let (rate, count) = summary_rate_and_count(&err);
    assert_eq!(count, 12, "{err}");
    assert_eq!(done_in(&err, "tokens"), "12");
    let done_rate: f64 = done_in(&err, "decode_tok_s").parse().unwrap();
    assert!(
        rate > 0.0 && (done_rate - rate).abs() < 0.01,
        "{rate} vs {done_rate}"
    );
}
