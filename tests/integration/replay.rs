//! Route traces and their replay: a trace of a real run replays to the run's
//! own hit rate under each policy, the policy never changes the text, and
//! what is not a whole trace is refused or replayed up to its cut.

use crate::common::{bmoe, bmoe_within, e8k2, e8k2_cli, e8k2_clustered, stderr, stdout, PROSE};

/// (hits, total) after `key` on the `moe-cache:` line: `hit 59.4% (3631/6109)`.
pub(crate) fn live_hits(err: &str, key: &str) -> (u64, u64) {
    let line = err
        .lines()
        .find(|l| l.starts_with("moe-cache:"))
        .unwrap_or_else(|| panic!("no moe-cache line in\n{err}"));
    let at = line.find(key).unwrap_or_else(|| panic!("{key} in {line}"));
    let counts = line[at..]
        .split('(')
        .nth(1)
        .and_then(|s| s.split(')').next());
    let (h, t) = counts.and_then(|c| c.split_once('/')).expect("hit counts");
    (h.parse().unwrap(), t.parse().unwrap())
}

/// The replay table's hit % over all demands and over generation for `policy`.
pub(crate) fn replayed_hits(out: &str, policy: &str) -> (String, f64) {
    let row = out
        .lines()
        .find(|l| l.contains(&format!("| {policy} |")))
        .unwrap_or_else(|| panic!("no {policy} row in\n{out}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    (cells[4].to_owned(), cells[5].parse().unwrap())
}

pub(crate) fn pct((hits, total): (u64, u64)) -> f64 {
    hits as f64 * 100.0 / total as f64
}

/// A run with a trace at a 25% cache under `policy`; returns (stdout, stderr, replay's stdout).
fn traced(prompt: &str, policy: &str, dir: &std::path::Path) -> (String, String, String) {
    let trace = dir.join(format!("{policy}-{}.trace", prompt.len()));
    let t = trace.to_str().unwrap();
    let flags = [
        "--cache-mb",
        "25%",
        "--cache-policy",
        policy,
        "--route-trace",
        t,
    ];
    let o = e8k2_cli(prompt, 24, &flags);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: route trace: "), "{}", stderr(&o));
    let r = bmoe(&["replay", t, "--cache-mb", "25%", "--policy", policy]);
    assert!(r.status.success(), "{}", stderr(&r));
    (stdout(&o), stderr(&o), stdout(&r))
}

#[test]
fn a_trace_replays_to_the_runs_own_hit_rate_under_each_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut texts = Vec::new();
    for policy in ["lru", "cycle", "learned"] {
        // A short prompt (its batch reads no layer ahead): the same hits exactly.
        let (text, err, replay) = traced("The capital of France is", policy, dir.path());
        let live = live_hits(&err, "hit ");
        assert!(
            live.0 > 0 && live.0 < live.1,
            "a cache that both hits and misses"
        );
        let (all, _) = replayed_hits(&replay, policy);
        assert_eq!(all, format!("{:.1}", pct(live)), "{replay}\n{err}");
        assert!(replay.contains("24 decodes"), "{replay}");
        assert!(replay.contains("prompt tokens, 23 generated"), "{replay}");
        texts.push(text);
        // A longer prompt reads layers ahead as fast as the disk allows: the
        // generation's hit rate within 2 points.
        let (_, err, replay) = traced(PROSE, policy, dir.path());
        let (_, generation) = replayed_hits(&replay, policy);
        let decode = pct(live_hits(&err, "decode hit "));
        assert!((generation - decode).abs() <= 2.0, "{replay}\n{err}");
    }
    assert!(
        texts.iter().all(|t| *t == texts[0]),
        "the policy never changes the text"
    );
}

/// gpt-oss's graph keeps every prompt row through its last layer: the trace
/// still tells the prompt from the generation (by the batch's logits, not by
/// the last layer's rows), so the replay's generation hit is the run's own.
#[test]
fn a_prompt_whose_last_layer_keeps_every_row_is_still_a_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::common::zoo_model("gpt-oss", "f32");
    let trace = dir.path().join("gpt-oss.trace");
    let t = trace.to_str().unwrap();
    // Several rows, but fewer routings than make a prompt read its next
    // layer whole ahead (`reads_whole_layer`): which of those guesses land
    // before their demand is timing, and decides what the generation starts
    // with in the cache, which a replay cannot know (a 13-token prompt gave
    // the run 40.9% decode hits in 1 of 12 runs against the replay's 31.8%).
    let prompt = "The capital of France is Paris, and";
    let flags = ["-n", "12", "--ignore-eos", "--cache-mb", "40%"];
    let o = bmoe(
        &[
            &["run", "-m", &model, "-p", prompt][..],
            &flags,
            &["--route-trace", t],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The run's policy is the default, learned.
    let r = bmoe(&["replay", t, "--cache-mb", "40%", "--policy", "learned"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let replay = stdout(&r);
    assert!(
        replay.contains(", 11 generated,"),
        "one prompt decode, 11 generated:\n{replay}"
    );
    let (_, generation) = replayed_hits(&replay, "learned");
    let decode = pct(live_hits(&stderr(&o), "decode hit "));
    assert!(
        decode < 100.0,
        "a cache that misses in decode: {}",
        stderr(&o)
    );
    assert!(
        (generation - decode).abs() <= 2.0,
        "{replay}\n{}",
        stderr(&o)
    );
}

#[test]
fn what_is_not_a_whole_trace_is_refused_or_replayed_to_its_cut() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.trace");
    let t = trace.to_str().unwrap();
    let o = e8k2_cli(PROSE, 4, &["--cache-mb", "0", "--route-trace", t]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A model file is not a trace: exit 2 with the reason.
    let r = bmoe(&["replay", e8k2().to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("not a bmoe route trace"),
        "{}",
        stderr(&r)
    );
    let r = bmoe(&["replay", t, "--cache-mb", "auto"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("not auto"), "{}", stderr(&r));
    // A trace cut mid-record replays what is whole, with a note.
    let bytes = std::fs::read(&trace).unwrap();
    let cut = dir.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let r = bmoe(&["replay", cut.to_str().unwrap(), "--cache-mb", "0"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stdout(&r).contains("ends mid-record"), "{}", stdout(&r));
    assert!(stdout(&r).contains("| optimum |"), "{}", stdout(&r));
    // Nothing is streamed with --resident: nothing to trace.
    let o = e8k2_cli(PROSE, 2, &["--resident", "--route-trace", t]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--route-trace"), "{}", stderr(&o));
}

/// `--predict-prefetch`'s share of guessed experts the routing used, on `model`.
fn predictor_accuracy(model: &std::path::Path) -> f64 {
    let m = model.to_str().unwrap();
    let args = [
        "run",
        "-m",
        m,
        "-p",
        PROSE,
        "-n",
        "24",
        "--cache-mb",
        "0",
        "--predict-prefetch",
    ];
    let o = bmoe(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.starts_with("moe-prefetch:"))
        .expect("a prefetch line");
    let after = line
        .split("routed (")
        .nth(1)
        .and_then(|s| s.split('%').next());
    let pct: f64 = after
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((0.0..=100.0).contains(&pct), "{line}");
    pct
}

/// The clustered router's experts follow the context: the next layer's
/// routing is predictable from this layer's input as on real MoEs (80-89%
/// published), far more than with the random router, and the text is the
/// model's own.
#[test]
fn a_clustered_router_makes_the_next_layers_routing_predictable() {
    let clustered = predictor_accuracy(e8k2_clustered());
    let random = predictor_accuracy(e8k2());
    assert!(clustered >= 80.0, "clustered {clustered}%");
    assert!(
        clustered > random + 5.0,
        "clustered {clustered}% vs random {random}%"
    );
    let m = e8k2_clustered().to_str().unwrap();
    let o = bmoe(&["run", "-m", m, "-p", "The capital of France is", "-n", "8"]);
    assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
}

/// A routing log of another tool, imported with a fixture model's sizes,
/// replays like a recorded trace; a malformed log is refused naming its line.
#[test]
fn an_imported_jsonl_log_replays() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("routes.jsonl");
    let mut lines = String::new();
    for token in 0..6u32 {
        for layer in 0..4u32 {
            let a = (token + layer) % 8;
            let b = (token * 3 + layer + 1) % 8;
            let b = if a == b { (b + 1) % 8 } else { b };
            lines += &format!(
                "{{\"token_pos\": {token}, \"layer_idx\": {layer}, \"topk_ids\": [{a}, {b}], \"topk_weights\": [0.6, 0.4]}}\n"
            );
        }
    }
    std::fs::write(&log, &lines).unwrap();
    let out = dir.path().join("routes.bmrt");
    let (l, o, m) = (
        log.to_str().unwrap(),
        out.to_str().unwrap(),
        e8k2().to_str().unwrap(),
    );
    let r = bmoe(&["trace", "import", l, "--like", m, "-o", o]);
    assert!(r.status.success(), "{}", stderr(&r));
    let s = stdout(&r);
    assert!(
        s.contains("imported 6 tokens x 4 layers, k 2, 8 experts"),
        "{s}"
    );
    assert!(
        s.contains("`topk_ids`") && s.contains("router weights kept"),
        "{s}"
    );
    let r = bmoe(&["replay", o, "--cache-mb", "25%"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stdout(&r).contains("6 generated"), "{}", stdout(&r));
    assert!(stdout(&r).contains("| optimum |"), "{}", stdout(&r));
    // A log cut mid-object: exit 2 naming the line, and no trace written.
    std::fs::write(&log, &lines[..lines.len() - 10]).unwrap();
    std::fs::remove_file(&out).unwrap();
    let r = bmoe(&["trace", "import", l, "--slot-bytes", "1000", "-o", o]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("line 24"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn inspect_forecasts_from_a_route_trace_of_the_model_or_the_published_curve() {
    let dir = tempfile::tempdir().unwrap();
    // The forecast replays the default policy: the run's is the same.
    let (_, err, _) = traced(PROSE, "learned", dir.path());
    let live = pct(live_hits(&err, "decode hit "));
    let trace = dir.path().join(format!("learned-{}.trace", PROSE.len()));
    let m = e8k2().to_str().unwrap();
    let t = trace.to_str().unwrap();
    let o = bmoe(&[
        "inspect",
        m,
        "--forecast",
        "--route-trace",
        t,
        "--probe-seconds",
        "0.5",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains(&format!("hit rates from: {t}")), "{out}");
    let row = |label: &str| -> Vec<f64> {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(label));
        let line = line.unwrap_or_else(|| panic!("no {label} row in\n{out}"));
        line.split_whitespace()
            .skip(1)
            .map(|w| w.parse().unwrap())
            .collect()
    };
    // cache, budget MiB, hit %, read MiB/token, fresh %, tok/s serial, overlap bound
    let (zero, quarter) = (row("0"), row("25%"));
    assert_eq!(zero[1], 0.0);
    assert!(
        (zero[2] - 94.92).abs() < 0.01,
        "cache 0 reads every routed slice: {out}"
    );
    // The trace's own hit at 25% is the run's, within the replay's 2 points.
    assert!((quarter[1] - live).abs() <= 2.0, "{out}\nlive {live}");
    assert!(quarter[4] > zero[4] && zero[4] > 0.0, "{out}");
    for label in ["10%", "50%", "auto"] {
        assert_eq!(row(label).len(), 6, "{out}");
    }
    // The decode probe streamed the model: its compute replaces the kernel's.
    let probe = out.lines().find(|l| l.contains("decode probe:"));
    let probe = probe.unwrap_or_else(|| panic!("no decode probe in\n{out}"));
    assert!(probe.contains("8 tokens streamed at cache 0"), "{probe}");
    let ms: f64 = probe
        .split("compute ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ms > 0.0, "{probe}");
    let o = bmoe(&[
        "inspect",
        m,
        "--forecast",
        "--probe-seconds",
        "0.5",
        "--probe-tokens",
        "0",
    ]);
    assert!(
        stdout(&o).contains("gpt-oss-20b's published routing"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains("decode probe"), "{}", stdout(&o));
    let o = bmoe(&["inspect", m, "--forecast", "--probe-tokens", "65"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--probe-tokens: give 0..=64"),
        "{}",
        stderr(&o)
    );
    let o = bmoe(&["inspect", m, "--route-trace", t]);
    assert_eq!(o.status.code(), Some(2), "--route-trace needs --forecast");
}

/// `trace import` with ids or sizes that would size a huge trace (an id of
/// 4 billion layers once aborted allocating 32 GB; 100 million layers wrote
/// an 800 MB trace replay refused; slot sizes overflowed), and a `.bmrt`
/// whose slot size passes 64 bits: refused with exit 2, never a panic or an
/// abort, nothing written. A byte order mark before the log is skipped; an
/// expert twice in one route is refused with its line.
#[test]
fn imports_and_traces_that_would_overflow_or_exhaust_memory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let out = p("t.bmrt");
    let o = out.to_str().unwrap();
    let import = |text: &[u8], sizes: &[&str]| {
        let log = p("log");
        std::fs::write(&log, text).unwrap();
        let mut args = vec!["trace", "import", log.to_str().unwrap(), "-o", o];
        args.extend(sizes);
        let r = bmoe_within(&args, 30);
        assert!(!stderr(&r).contains("panicked"), "{}", stderr(&r));
        r
    };
    let slot = ["--slot-bytes", "1000"];
    for (text, want) in [
        (
            &b"{\"layer\": 4000000000, \"experts\": [1]}\n"[..],
            "line 1: layer 4000000000 out of range",
        ),
        (
            b"{\"layer\": 100000000, \"experts\": [1]}\n",
            "layer 100000000 out of range",
        ),
        (b"0,4294967295,1\n", "line 1: layer 4294967295 out of range"),
        (b"0,1\n0,1\n1,2\n1,3\n", "line 1: expert 1 twice in layer 0"),
    ] {
        let r = import(text, &slot);
        assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
        assert!(stderr(&r).contains(want), "{}", stderr(&r));
        assert!(!out.exists(), "nothing written");
    }
    let m = e8k2().to_str().unwrap();
    let r = import(b"{\"layer\": 30, \"experts\": [1]}\n", &["--like", m]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("has 30 layers"), "{}", stderr(&r));
    for n in ["18446744073709551615", "9223372036854775807"] {
        let r = import(b"0,1\n1,2\n", &["--slot-bytes", n]);
        assert_eq!(r.status.code(), Some(2), "{n}: {}", stderr(&r));
        assert!(stderr(&r).contains("give the real size"), "{}", stderr(&r));
    }
    // A byte order mark is not taken for a CSV's first field.
    let r = import(b"\xEF\xBB\xBF{\"layer\": 0, \"experts\": [1, 2]}\n", &slot);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stdout(&r).contains("(jsonl:"), "{}", stdout(&r));
    // A trace whose second layer's slot size is u64::MAX (bytes 32..40 of
    // the header): replay and the forecast refuse it.
    let r = import(b"0,1\n1,2\n", &slot);
    assert!(r.status.success(), "{}", stderr(&r));
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&out, &bytes).unwrap();
    for args in [
        vec!["replay", o],
        vec![
            "inspect",
            m,
            "--forecast",
            "--route-trace",
            o,
            "--probe-seconds",
            "60",
        ],
    ] {
        let r = bmoe_within(&args, 30);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
        assert!(stderr(&r).contains("route trace header"), "{}", stderr(&r));
        assert!(!stderr(&r).contains("panicked"), "{}", stderr(&r));
    }
}

/// `inspect --forecast --route-trace` refuses another model's trace (as
/// `--cache-warm` refuses its profile) and any trace it cannot use before
/// its probe runs: a 60 s probe would break the 30 s bound.
#[test]
fn the_forecast_refuses_another_models_trace_before_probing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, trace) = (dir.path().join("log.csv"), dir.path().join("two.bmrt"));
    std::fs::write(&log, "0,1\n0,2\n1,3\n1,0\n").unwrap();
    let (l, t) = (log.to_str().unwrap(), trace.to_str().unwrap());
    let r = bmoe(&["trace", "import", l, "--slot-bytes", "1000", "-o", t]);
    assert!(r.status.success(), "{}", stderr(&r));
    let m = e8k2().to_str().unwrap();
    for (file, want) in [
        (
            t,
            "is another model's trace (the trace has 2 MoE layers of 2 x 4 experts",
        ),
        ("/dev/zero", "not a regular file"),
        (l, "not a bmoe route trace"),
    ] {
        let args = [
            "inspect",
            m,
            "--forecast",
            "--route-trace",
            file,
            "--probe-seconds",
            "60",
        ];
        let r = bmoe_within(&args, 30);
        assert_eq!(r.status.code(), Some(2), "{file}: {}", stderr(&r));
        assert!(stderr(&r).contains(want), "{file}: {}", stderr(&r));
        assert!(!stdout(&r).contains("hit rates from"), "{}", stdout(&r));
    }
}
