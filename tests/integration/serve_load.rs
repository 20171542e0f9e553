//! `bmoe serve --parallel 4 --queue 8` under load on the E8K2 fixture:
//! 16 concurrent clients x 4 requests over loopback, each answered in full
//! or refused with 429, none left hanging; /health quick throughout; memory
//! flat; a client that leaves mid-stream frees its sequence; batched decodes
//! really carry several sequences.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::PROSE;
use super::serve::{completion, sse_data, Server};

const CLIENTS: usize = 16;
const REQUESTS_PER_CLIENT: usize = 4;

#[test]
fn sixteen_clients_get_answers_or_429_health_stays_quick_and_memory_flat() {
    let server = Arc::new(Server::start(&["--parallel", "4", "--queue", "8"]));
    let (s, first) = server.post(
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 8})),
    );
    assert_eq!(s, 200, "{first}");
    let rss_first = rss_kib(server.pid());
    let done = Arc::new(AtomicBool::new(false));
    let health = {
        let (server, done) = (server.clone(), done.clone());
        std::thread::spawn(move || worst_health(&server, &done))
    };
    leave_mid_stream(&server);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let server = server.clone();
            std::thread::spawn(move || client(&server, c))
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|h| h.join().expect("a client thread failed"))
        .collect();
    done.store(true, Ordering::Relaxed);
    let (worst, polls) = health.join().expect("the health poller failed");
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(statuses.len(), CLIENTS * REQUESTS_PER_CLIENT);
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert!(
        ok >= 12,
        "the slots and the queue take at least 12: {statuses:?}"
    );
    assert!(
        polls >= 5,
        "health was polled during the load ({polls} times)"
    );
    assert!(
        worst < Duration::from_secs(1),
        "/health took {worst:?} at worst"
    );
    let metrics = settled_metrics(&server);
    assert!(gauge(&metrics, "bmoe_slots_busy") == 0.0, "{metrics}");
    assert!(
        gauge(&metrics, "bmoe_requests_cancelled_total") >= 1.0,
        "{metrics}"
    );
    let seqs = gauge(&metrics, "bmoe_decode_sequences_total");
    let decodes = gauge(&metrics, "bmoe_decodes_total");
    assert!(
        seqs > decodes * 1.5,
        "decodes carry several sequences: {seqs} in {decodes}"
    );
    let rss_after = rss_kib(server.pid());
    eprintln!(
        "load: {ok} of {} answered (the rest 429), /health worst {worst:?} over {polls} polls, \
         {seqs} sequences in {decodes} decodes, RSS {rss_first} -> {rss_after} KiB",
        statuses.len()
    );
    assert!(
        rss_after as f64 <= rss_first as f64 * 1.10,
        "RSS grew from {rss_first} KiB after the first request to {rss_after} KiB"
    );
}

/// One client's requests, one after another (chat and completions, streamed
/// and not, by turn); the statuses. Each answer is checked complete.
fn client(server: &Server, c: usize) -> Vec<u16> {
    (0..REQUESTS_PER_CLIENT)
        .map(|r| {
            let stream = (c + r) % 2 == 0;
            let prompt = format!("{PROSE} a client numbered {c}, who asked {r} times");
            let extra = json!({"max_tokens": 8, "stream": stream, "user": format!("client-{c}")});
            let body = if c % 2 == 0 {
                completion(&prompt, extra)
            } else {
                let mut b = json!({"messages": [{"role": "user", "content": prompt}]});
                merge(&mut b, extra);
                b
            };
            let path = if c % 2 == 0 {
                "/v1/completions"
            } else {
                "/v1/chat/completions"
            };
            let (status, text) = server.request("POST", path, &body.to_string(), &[]);
            if status == 200 {
                assert_complete(&text, stream);
            } else {
                assert!(text.contains("queue is full"), "{status}: {text}");
            }
            status
        })
        .collect()
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// A whole answer: a streamed one ends with `[DONE]`, a plain one has a
/// finish reason and usage.
fn assert_complete(text: &str, stream: bool) {
    if stream {
        let data = sse_data(text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
        return;
    }
    let v: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("JSON body: {text}"));
    assert!(v["choices"][0]["finish_reason"].is_string(), "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{v}"
    );
}

/// A streamed request whose client reads its first bytes and leaves.
fn leave_mid_stream(server: &Server) {
    let long = completion(PROSE, json!({"max_tokens": 400, "stream": true})).to_string();
    let mut leaving = server.send("POST", "/v1/completions", &long, &[]);
    let mut first = [0u8; 64];
    let n = leaving.read(&mut first).expect("the stream's first bytes");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1."));
}

/// Poll /health every 100 ms until `done`; the slowest answer and how many.
fn worst_health(server: &Server, done: &AtomicBool) -> (Duration, usize) {
    let (mut worst, mut polls) = (Duration::ZERO, 0);
    while !done.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let (status, _) = server.request("GET", "/health", "", &[]);
        assert_eq!(status, 200);
        worst = worst.max(t0.elapsed());
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    (worst, polls)
}

/// /metrics once no sequence is busy (the leaving client's included), or
/// after 30 s.
fn settled_metrics(server: &Server) -> String {
    let t0 = Instant::now();
    loop {
        let (_, m) = server.request("GET", "/metrics", "", &[]);
        if gauge(&m, "bmoe_slots_busy") == 0.0 || t0.elapsed() > Duration::from_secs(30) {
            return m;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A metric without labels (NaN when absent).
pub(crate) fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// The process's resident set in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}
