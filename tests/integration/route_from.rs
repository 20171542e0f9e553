//! `--route-from TRACE`: a run routed by a route trace streams exactly the
//! trace's experts (its own trace is the one it was given, wrapping past its
//! end) and hits the cache as the trace's replay says; resident, the same
//! forced routing computes the same text; a trace of another shape, or one
//! beside speculation, is refused.

use std::path::Path;
use std::process::Output;

use bmoe::stream::route_from::{ForcedRoutes, RunShape};
use bmoe_trace::route_trace::{TraceHeader, TraceReader, TraceRecord};

use crate::common::{bmoe, stderr, stdout, zoo_model};
use crate::replay::{live_hits, pct, replayed_hits};

/// Two prompts of the same token count (the second forced with the first's
/// routing, so its decodes line up with the trace's).
const PROMPT_A: &str = "The capital of France is";
const PROMPT_B: &str = "The capital of Spain is";

fn records(p: &Path) -> (TraceHeader, Vec<TraceRecord>) {
    let f = std::fs::File::open(p).expect("a trace");
    let r = TraceReader::new(std::io::BufReader::new(f)).expect("a trace header");
    r.records().expect("whole records")
}

/// `bmoe run -m model -p prompt -n n --ignore-eos FLAGS...`.
fn run(model: &str, prompt: &str, n: u32, flags: &[&str]) -> Output {
    let n = n.to_string();
    let base = ["run", "-m", model, "-p", prompt, "-n", &n, "--ignore-eos"];
    bmoe(&[&base[..], flags].concat())
}

/// A whole number of the run's `BMOE_DONE` line.
fn done_number(stderr: &str, key: &str) -> u32 {
    let at = format!("\"{key}\":");
    let rest = stderr
        .split(&at)
        .nth(1)
        .unwrap_or_else(|| panic!("no {key} in {stderr}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("{key}: {rest}"))
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stderr(o)
}

#[test]
fn a_forced_run_streams_the_traces_experts_and_replays_to_its_hit_rate() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let (a, b, c) = (path("a.trace"), path("b.trace"), path("c.trace"));
    let model = zoo_model("qwen3moe", "f32");
    let cache = ["--cache-mb", "50%", "--cache-policy", "lru"];
    ok(&run(
        &model,
        PROMPT_A,
        12,
        &[&cache[..], &["--route-trace", &a]].concat(),
    ));
    // Another prompt of the same length, routed from A: its trace is A's.
    let forced = run(
        &model,
        PROMPT_B,
        12,
        &[&cache[..], &["--route-from", &a, "--route-trace", &b]].concat(),
    );
    let err = ok(&forced);
    assert!(err.contains("meaningless by design"), "{err}");
    assert!(err.contains(&format!("\"route_from\":\"{a}\"")), "{err}");
    assert_eq!(records(Path::new(&b)).1, records(Path::new(&a)).1);
    // Its decode hit rate is A's replay's at the same budget and policy.
    let r = bmoe(&["replay", &a, "--cache-mb", "50%", "--policy", "lru"]);
    ok(&r);
    let (_, generation) = replayed_hits(&stdout(&r), "lru");
    let decode = pct(live_hits(&err, "decode hit "));
    assert!((generation - decode).abs() <= 1.0, "{}\n{err}", stdout(&r));
    // Past the trace's end the rows wrap to its first tokens.
    let wrapped = ok(&run(
        &model,
        PROMPT_B,
        30,
        &["--cache-mb", "0", "--route-from", &a, "--route-trace", &c],
    ));
    let table = |p: &str| {
        let (h, recs) = records(Path::new(p));
        ForcedRoutes::from_records(&h, &recs).expect("routes")
    };
    let (ta, tc) = (table(&a), table(&c));
    assert!(
        tc.tokens() > ta.tokens() + 10,
        "{} {}",
        tc.tokens(),
        ta.tokens()
    );
    for t in 0..tc.tokens() as u64 {
        for layer in 0..2 {
            assert_eq!(
                tc.row(t, layer),
                ta.row(t, layer),
                "token {t} layer {layer}"
            );
        }
    }
    // What `inspect --forecast --forced-run P,30` replays is this run's own trace.
    let shape = RunShape {
        prompt_tokens: done_number(&wrapped, "prompt_tokens"),
        generated_tokens: 30,
    };
    let routing = |recs: Vec<TraceRecord>| -> Vec<TraceRecord> {
        let weights = |r: &TraceRecord| matches!(r, TraceRecord::Weights { .. });
        recs.into_iter().filter(|r| !weights(r)).collect()
    };
    assert_eq!(
        ta.run_records(&[0, 1], shape),
        routing(records(Path::new(&c)).1)
    );
    // Resident: llama.cpp's mapping, the same forced routing, the same text.
    let resident = run(&model, PROMPT_B, 12, &["--resident", "--route-from", &a]);
    let rerr = ok(&resident);
    assert!(rerr.contains("meaningless by design"), "{rerr}");
    assert_eq!(stdout(&resident), stdout(&forced));
    let own = run(&model, PROMPT_B, 12, &["--resident"]);
    ok(&own);
    assert_ne!(
        stdout(&own),
        stdout(&forced),
        "the forcing changed the routing"
    );
}

#[test]
fn a_trace_of_another_shape_or_beside_speculation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("deepseek2.trace");
    let other = other.to_str().unwrap();
    // deepseek2's zoo model: 3 blocks, the first dense.
    let deepseek = zoo_model("deepseek2", "f32");
    ok(&run(&deepseek, PROMPT_A, 2, &["--route-trace", other]));
    let qwen = zoo_model("qwen3moe", "f32");
    for mode in [&["--cache-mb", "auto"][..], &["--resident"][..]] {
        let o = run(
            &qwen,
            PROMPT_A,
            2,
            &[mode, &["--route-from", other]].concat(),
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("another shape") && err.contains("--route-trace"),
            "{err}"
        );
        assert!(!err.contains("BMOE_DONE"), "a refusal runs nothing: {err}");
    }
    // A model file is no trace.
    let o = run(&qwen, PROMPT_A, 2, &["--route-from", &qwen]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a bmoe route trace"),
        "{}",
        stderr(&o)
    );
    // Speculation's drafts would take the rows out of step.
    let o = run(&qwen, PROMPT_A, 2, &["--route-from", other, "--ngram"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--ngram/--mtp/--spec"),
        "{}",
        stderr(&o)
    );
}

/// A prompt in several micro-batches: those without the row that wants
/// logits route no row through the last layer, and the trace still reads
/// (replay, and a forced run whose own trace is the same).
#[test]
fn a_prompt_in_several_micro_batches_is_traced_replayed_and_forced() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let (a, b) = (path("a.trace"), path("b.trace"));
    let model = zoo_model("qwen3moe", "f32");
    let prose = crate::common::PROSE;
    let prompt = format!("{prose} {prose} {prose}");
    let flags = ["--ubatch", "16", "--cache-mb", "50%"];
    let err = ok(&run(
        &model,
        &prompt,
        4,
        &[&flags[..], &["--route-trace", &a]].concat(),
    ));
    assert!(err.contains("micro-batches of 16"), "{err}");
    ok(&bmoe(&["replay", &a, "--cache-mb", "50%"]));
    let forced = [&flags[..], &["--route-from", &a, "--route-trace", &b]].concat();
    ok(&run(&model, &prompt, 4, &forced));
    assert_eq!(records(Path::new(&b)).1, records(Path::new(&a)).1);
}
