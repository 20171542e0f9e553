//! `bmoe serve`'s queue, shutdown, clients and hostile input: a full queue answers 429, SIGTERM cuts a reply and says so, the official Python clients, a hostile template, a client that left.

use super::common::{self, PROSE};
use serde_json::{json, Value};
use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use super::serve::*;

/// Until the server's `/metrics` shows `n` requests waiting (a request sent
/// is queued by the server's own thread, some time after the send).
fn wait_for_queue_depth(server: &Server, n: u32) {
    let t0 = Instant::now();
    loop {
        let (_, metrics) = server.request("GET", "/metrics", "", &[]);
        if crate::serve_load::gauge(&metrics, "bmoe_queue_depth") == n as f64 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{n} request(s) never waited: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_full_queue_answers_429_a_client_that_leaves_frees_the_engine_and_sigterm_exits_0() {
    let server = Server::start(&["--queue", "1"]);
    // A long streamed request occupies the engine; its client reads one chunk and leaves.
    let long = completion(PROSE, json!({"max_tokens": 400, "stream": true})).to_string();
    let mut leaving = server.send("POST", "/v1/completions", &long, &[]);
    let mut first = [0u8; 256];
    let n = leaving
        .read(&mut first)
        .expect("the first bytes of the stream");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1."));
    // One request may wait; more are refused at once.
    let waiting = server.send(
        "POST",
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 4})).to_string(),
        &[],
    );
    wait_for_queue_depth(&server, 1);
    let raw = server.raw(
        "POST",
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 4})).to_string(),
        &[],
    );
    let (s, text) = split_response(&raw);
    assert_eq!(s, 429, "{text}");
    assert!(text.contains("queue is full"));
    assert!(
        raw.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "a 429 says when to come back: {raw}"
    );
    drop(leaving);
    // The waiting request completes well before the 400 tokens the first asked for.
    let t0 = Instant::now();
    let mut raw = String::new();
    let mut w = waiting;
    w.read_to_string(&mut raw).unwrap();
    assert_eq!(split_response(&raw).0, 200);
    assert!(t0.elapsed() < Duration::from_secs(60));
    let (_, metrics) = server.request("GET", "/metrics", "", &[]);
    let cancelled = metrics
        .lines()
        .find(|l| l.starts_with("bmoe_requests_cancelled_total"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(cancelled.ends_with(" 1"), "{cancelled}");
    assert!(
        metrics.contains("bmoe_requests_rejected_total 1"),
        "{metrics}"
    );
    let status = server.terminate(20);
    assert_eq!(status.code(), Some(0), "SIGTERM stops the server cleanly");
}

/// A streamed reply cut by SIGTERM ends with finish_reason "length" and
/// a note saying it was cut (it once ended "stop", with no note).
#[test]
fn a_reply_cut_by_sigterm_says_so() {
    let server = Server::start(&[]);
    let long = chat_body(
        "Tell me a very long story.",
        json!({"max_tokens": 400, "stream": true}),
    );
    let mut s = server.send("POST", "/v1/chat/completions", &long.to_string(), &[]);
    let mut first = [0u8; 512];
    let n = s.read(&mut first).expect("the stream starts");
    assert!(n > 0);
    let pid = server.pid() as i32;
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    let chunks = sse_data(&rest);
    let finish = chunks
        .iter()
        .filter_map(|c| serde_json::from_str::<Value>(c).ok())
        .find(|v| v["choices"][0]["finish_reason"].is_string())
        .unwrap_or_else(|| panic!("a finish chunk in {rest}"));
    assert_eq!(finish["choices"][0]["finish_reason"], "length", "{finish}");
    assert!(
        finish["bmoe"]["notes"].to_string().contains("cut short"),
        "{finish}"
    );
    let mut server = server;
    let status = common::wait_within(&mut server.child, 20, "bmoe serve after SIGTERM");
    assert_eq!(
        status.code(),
        Some(0),
        "one SIGTERM stops the server cleanly"
    );
}

/// Run tests/integration/SCRIPT with ARGS; assert it succeeded and printed `ok`.
pub fn run_client_script(script: &str, args: &[&str], ok: &str) {
    let script = format!("{}/tests/integration/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .env("PYTHONPATH", common::python_clients())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}\n{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    assert!(common::stdout(&out).contains(ok));
}

#[test]
fn the_openai_python_client_works() {
    let server = Server::start(&[]);
    let url = format!("http://127.0.0.1:{}/v1", server.port);
    run_client_script("openai_client.py", &[&url, PROSE], "openai client: ok");
}

#[test]
fn the_anthropic_python_client_works() {
    let server = Server::start(&["--api-key", "sesame"]);
    let url = format!("http://127.0.0.1:{}", server.port);
    run_client_script(
        "anthropic_client.py",
        &[&url, "sesame"],
        "anthropic client: ok",
    );
}

/// A server whose chat template never ends well (`--chat-template-file`)
/// answers each chat request with an error naming the limit, within the
/// bound, and keeps answering; SIGTERM during a long render ends the server
/// promptly (the engine thread once stayed wedged in the render).
#[test]
fn a_hostile_template_gets_an_error_reply_and_sigterm_ends_its_render() {
    let dir = tempfile::tempdir().unwrap();
    let (_, loops, limit) = super::chat::HOSTILE_TEMPLATES[3];
    let t = super::chat::template_file(dir.path(), "loops", loops);
    let server = Server::start(&["--chat-template-file", &t]);
    for _ in 0..2 {
        let t0 = Instant::now();
        let (status, body) = server.post(
            "/v1/chat/completions",
            &chat_body("Hi", json!({"max_tokens": 2})),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(limit), "{body}");
        assert!(t0.elapsed() < Duration::from_secs(30));
    }
    let status = server.terminate(20);
    assert_eq!(status.code(), Some(0));

    // A client that leaves mid-render ends the render (counted as
    // cancelled) well before the render's own 10 s time limit.
    let t = super::chat::template_file(dir.path(), "slow", super::chat::SLOW_TEMPLATE);
    let mut server = Server::start(&["--chat-template-file", &t]);
    let body = chat_body("Hi", json!({"max_tokens": 2})).to_string();
    let leaving = server.send("POST", "/v1/chat/completions", &body, &[]);
    std::thread::sleep(Duration::from_millis(1000));
    drop(leaving);
    let t0 = Instant::now();
    loop {
        let (_, metrics) = server.request("GET", "/metrics", "", &[]);
        if metrics.contains("bmoe_requests_cancelled_total 1") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "the render outlived its client: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _pending = server.send("POST", "/v1/chat/completions", &body, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let status = common::wait_within(&mut server.child, 20, "bmoe serve after SIGTERM mid-render");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(status.code(), Some(0));
}

/// Issue 64, finding 9: a client that leaves mid-reply is logged as gone,
/// not as `finish="length"` (a reply cut by its own limit).
#[test]
fn a_client_that_left_is_logged_as_gone() {
    let server = Server::start(&["-v"]);
    let body = json!({"prompt": PROSE, "max_tokens": 400, "stream": true}).to_string();
    let mut leaving = server.send("POST", "/v1/completions", &body, &[]);
    let mut first = [0u8; 64];
    leaving.read_exact(&mut first).expect("the reply's head");
    drop(leaving);
    let lines = super::prompt_cache::log_has(&server, &["request answered"]);
    let answered = lines
        .iter()
        .find(|l| l.contains("request answered"))
        .unwrap();
    assert!(answered.contains("client_gone"), "{answered}");
}
