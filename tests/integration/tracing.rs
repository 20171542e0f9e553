//! `--trace-chrome`: a streamed 16-token run's trace opens as JSON, spans nest
//! per thread, the actors sit on separate tracks, and flash reads overlap
//! compute; an MTP run's draft actor has its own track and works only between
//! the verify decodes.

use std::collections::HashMap;
use std::path::Path;

use crate::common::{e8k2_cli, stderr, tiny_mtp, tiny_run_n};

#[derive(Debug, Clone)]
struct Span {
    name: String,
    tid: u64,
    ts: f64,
    end: f64,
}

/// The trace's track names (by thread id) and complete spans.
fn read_trace(trace: &Path) -> (HashMap<u64, String>, Vec<Span>) {
    let text = std::fs::read_to_string(trace).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).expect("the trace is valid JSON");
    let events = json.as_array().expect("a JSON array of events");
    let mut tracks: HashMap<u64, String> = HashMap::new();
    let mut spans = Vec::new();
    for e in events {
        match e["ph"].as_str() {
            Some("M") => {
                tracks.insert(
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().to_owned(),
                );
            }
            Some("X") => {
                let ts = e["ts"].as_f64().unwrap();
                spans.push(Span {
                    name: e["name"].as_str().unwrap().to_owned(),
                    tid: e["tid"].as_u64().unwrap(),
                    ts,
                    end: ts + e["dur"].as_f64().unwrap(),
                });
            }
            other => panic!("unexpected event kind {other:?}: {e}"),
        }
    }
    (tracks, spans)
}

#[test]
fn chrome_trace_of_a_streamed_run_nests_spans_and_shows_reads_under_compute() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let o = e8k2_cli(
        "Once upon a time",
        16,
        &[
            "--cache-mb",
            "0",
            "--overlap",
            "--predict-prefetch",
            "--trace-chrome",
            trace.to_str().unwrap(),
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("trace: "), "{err}");
    let (tracks, spans) = read_trace(&trace);
    let of = |name: &str| {
        spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    let decodes = of("verify.decode");
    assert_eq!(decodes.len(), 16, "prefill + 15 single-token decodes");
    let verify_tid = decodes[0].tid;
    let flash_tid = of("flash.demand")[0].tid;
    assert_ne!(verify_tid, flash_tid, "verify and flash on separate tracks");
    assert_eq!(tracks[&flash_tid], "bmoe-flash");
    let telemetry = of("telemetry.write");
    assert!(!telemetry.is_empty());
    assert_eq!(tracks[&telemetry[0].tid], "bmoe-telemetry");
    // Nesting: every compute segment and wait lies inside a decode of its thread.
    let within = |s: &Span| {
        decodes
            .iter()
            .any(|d| d.tid == s.tid && d.ts <= s.ts + 0.01 && s.end <= d.end + 0.01)
    };
    for name in ["verify.segment", "hook.wait", "hook.wait_down"] {
        let v = of(name);
        assert!(!v.is_empty(), "no {name} spans");
        for s in &v {
            assert_eq!(s.tid, verify_tid, "{name} on the verify thread");
            assert!(within(s), "{name} outside every decode: {s:?}");
        }
    }
    // Reads: one lane per queue slot, and some of them run while the verify
    // thread computes (a segment), which is what overlap and prefetch are for.
    let reads = of("flash.read_op");
    assert!(!reads.is_empty());
    assert!(reads.iter().all(|r| tracks[&r.tid].contains("lane")));
    let segments = of("verify.segment");
    let overlapping = reads
        .iter()
        .filter(|r| segments.iter().any(|s| r.ts < s.end && s.ts < r.end))
        .count();
    assert!(
        overlapping > 0,
        "no flash read overlaps a compute segment ({} reads)",
        reads.len()
    );
}

#[test]
fn an_mtp_trace_shows_the_draft_actor_on_its_track_between_the_verify_decodes() {
    let model = tiny_mtp(0.0, 0.25);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let flags = [
        "--cache-mb",
        "0",
        "--mtp",
        "--draft",
        "2",
        "--head-predemand",
        "--trace-chrome",
        trace.to_str().unwrap(),
    ];
    let o = tiny_run_n(&model, 16, &flags);
    assert!(o.status.success(), "{}", stderr(&o));
    let (tracks, spans) = read_trace(&trace);
    let of = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let steps = of("draft.step");
    let decodes = of("verify.decode");
    assert!(!steps.is_empty() && !decodes.is_empty());
    assert!(steps.iter().all(|s| tracks[&s.tid] == "bmoe-draft"));
    // The hand-over: the head works only while the verify thread waits for
    // its reply, never during a verify decode.
    for s in &steps {
        let during = decodes.iter().find(|d| s.ts < d.end && d.ts < s.end);
        assert!(during.is_none(), "{s:?} overlaps {during:?}");
    }
    // The overlap the actor exists for: after handing its drafts over it asks
    // for its catch-up's experts in the background, on its own track.
    let pre = of("draft.predemand");
    assert!(!pre.is_empty(), "no pre-demand spans");
    assert!(pre.iter().all(|s| tracks[&s.tid] == "bmoe-draft"));
}
