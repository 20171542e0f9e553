//! `bmoe serve`'s request handling used carelessly (issue 48): the reply
//! length a request leaves out, response ids and times, an assistant
//! message given last (a prefill), tool names, fields this server has not,
//! serde's words, an empty Anthropic system list, a declared body far over
//! the limit, and the flags `--api-key` and `--host`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::{self, e8k2, smollm2, PROSE};
use super::serve::{chat_body, completion, Server};

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `serve -n 3`: a request without `max_tokens` gets 3 tokens (it once ran
/// to the end of the context); each response has its own `created`, and
/// ids differ between two runs of the server.
#[test]
fn serve_n_is_the_default_reply_length_and_ids_are_fresh() {
    let first_id = {
        let server = Server::start(&["-n", "3"]);
        // The server's start is at least a second before the request.
        std::thread::sleep(Duration::from_millis(1100));
        let asked_s = now_s();
        let (s, a) = server.post("/v1/completions", &completion(PROSE, json!({})));
        assert_eq!(s, 200, "{a}");
        let n = a["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..=3).contains(&n), "-n 3 bounds a reply: {a}");
        assert!(
            a["created"].as_u64().unwrap() >= asked_s,
            "created is the response's time, not the server's start: {a}"
        );
        let (_, b) = server.post("/v1/chat/completions", &chat_body("Hi.", json!({})));
        assert!(
            b["usage"]["completion_tokens"].as_u64().unwrap() <= 3,
            "{b}"
        );
        let (_, m) = server.post(
            "/v1/messages",
            &json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}),
        );
        let ids = [&a["id"], &b["id"], &m["id"]].map(|v| v.as_str().unwrap().to_string());
        assert!(ids[0].starts_with("cmpl-bmoe"), "{ids:?}");
        assert!(ids[1].starts_with("chatcmpl-bmoe"), "{ids:?}");
        assert!(ids[2].starts_with("msg_bmoe"), "{ids:?}");
        ids[0].clone()
    };
    let server = Server::start(&["-n", "3"]);
    let (_, a) = server.post("/v1/completions", &completion(PROSE, json!({})));
    assert_ne!(
        a["id"].as_str().unwrap(),
        first_id,
        "a restarted server's first id is not the last run's"
    );
}

/// The greedy reply's first words given as a last assistant message are
/// continued: the new text is what the reply went on with (a new turn would
/// begin the reply again), on both chat routes.
#[test]
fn a_last_assistant_message_is_continued_on_both_chat_routes() {
    let server = Server::start(&[]);
    let user = "Tell me a story.";
    let (s, plain) = server.post(
        "/v1/chat/completions",
        &chat_body(user, json!({"max_tokens": 16})),
    );
    assert_eq!(s, 200, "{plain}");
    let reply = plain["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The first two words, up to the space before the third.
    let cut = reply
        .match_indices(' ')
        .map(|(i, _)| i)
        .find(|&i| reply[..i].split_whitespace().count() == 2)
        .unwrap_or_else(|| panic!("three words in {reply:?}"));
    let prefill = &reply[..cut];
    let turn =
        json!([{"role": "user", "content": user}, {"role": "assistant", "content": prefill}]);
    let (s, openai) = server.post(
        "/v1/chat/completions",
        &json!({"messages": turn, "max_tokens": 4}),
    );
    assert_eq!(s, 200, "{openai}");
    let (s, anthropic) = server.post("/v1/messages", &json!({"messages": turn, "max_tokens": 4}));
    assert_eq!(s, 200, "{anthropic}");
    for more in [
        openai["choices"][0]["message"]["content"].as_str().unwrap(),
        anthropic["content"][0]["text"].as_str().unwrap(),
    ] {
        assert!(!more.is_empty());
        let whole = format!("{prefill}{more}");
        assert!(
            reply.starts_with(&whole),
            "{prefill:?} continued with {more:?}, not as the reply {reply:?} went on"
        );
    }
}

/// Careless request bodies: each a 400 naming the field and the fix, in
/// JSON's words, alike on both routes where both take the field.
#[test]
fn careless_bodies_get_a_400_naming_the_field() {
    let server = Server::start(&[]);
    let openai = |path: &str, body: Value, param: Option<&str>, says: &str| {
        let (s, v) = server.post(path, &body);
        assert_eq!(s, 400, "{body} -> {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(says), "{m:?} lacks {says:?}");
        for rust in ["struct", "i64", "f32", "enum", "sequence"] {
            assert!(!m.contains(rust), "{m:?} names a Rust type");
        }
    };
    let tool = |name: &str| json!({"type": "function", "function": {"name": name}});
    let with_tools = |tools: Value| chat_body("hi", json!({"tools": tools}));
    let chat = "/v1/chat/completions";
    openai(
        chat,
        with_tools(json!([tool("")])),
        Some("tools"),
        "tools[0].function.name is empty",
    );
    for bad in ["<tool_call>", "a\"b", "a\nb", "a\0b"] {
        openai(
            chat,
            with_tools(json!([tool(bad)])),
            Some("tools"),
            "letters, digits, _ or -",
        );
    }
    openai(
        chat,
        with_tools(json!([tool("f"), tool("f")])),
        Some("tools"),
        "is also tools[0].function.name",
    );
    let params = json!([{"type": "function", "function": {"name": "f", "parameters": []}}]);
    openai(
        chat,
        with_tools(params),
        Some("tools"),
        "parameters must be a JSON Schema object",
    );
    let cmpl = "/v1/completions";
    openai(
        cmpl,
        json!([PROSE]),
        None,
        "the body must be a JSON object, not an array",
    );
    let typed = completion(PROSE, json!({"max_tokens": "5"}));
    openai(cmpl, typed, Some("max_tokens"), "expected an integer");
    for (field, value) in [
        ("echo", json!(true)),
        ("logprobs", json!(1)),
        ("suffix", json!("!")),
        ("best_of", json!(2)),
    ] {
        let body = completion(PROSE, json!({ field: value }));
        openai(cmpl, body, Some(field), field);
    }
    let defaults =
        json!({"max_tokens": 1, "echo": false, "logprobs": null, "suffix": null, "best_of": 1});
    assert_eq!(server.post(cmpl, &completion(PROSE, defaults)).0, 200);

    let anthropic = |body: Value, says: &str| {
        let (s, v) = server.post("/v1/messages", &body);
        assert_eq!(s, 400, "{body} -> {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(says), "{m:?} lacks {says:?}");
    };
    let tools = |names: &[&str]| {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "input_schema": {"type": "object"}}))
            .collect();
        json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "tools": tools})
    };
    anthropic(tools(&[""]), "tools[0].name is empty");
    anthropic(tools(&["a\"b"]), "letters, digits, _ or -");
    anthropic(tools(&["f", "f"]), "is also tools[0].name");

    // An empty system list is no system prompt: the template's default stays.
    let input_tokens = |system: Value| {
        let body = json!({"max_tokens": 1, "system": system, "messages": [{"role": "user", "content": "hi"}]});
        let (s, v) = server.post("/v1/messages", &body);
        assert_eq!(s, 200, "{v}");
        // The part of the prompt decoded and the part found cached.
        let u = &v["usage"];
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert_eq!(input_tokens(json!([])), input_tokens(Value::Null));
}

/// A head declaring a body far over the limit, then a few bytes: 413 at
/// once (it once held the connection, waiting for the rest).
#[test]
fn a_declared_length_over_the_limit_is_answered_413_at_once() {
    let server = Server::start(&["--body-limit-kb", "16"]);
    for (path, shape) in [
        ("/v1/completions", "\"error\":{\"message\""),
        ("/v1/messages", "\"type\":\"error\""),
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 99999999999999\r\n\r\n{{\"prompt\": \"hi\"");
        s.write_all(head.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        // The whole answer, without closing our side: no hang within 30 s.
        while !String::from_utf8_lossy(&raw).contains("}}") {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) => panic!("{path}: no answer within 30 s ({e})"),
            }
        }
        let raw = String::from_utf8_lossy(&raw);
        assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
        assert!(
            raw.contains(shape) && raw.contains("--body-limit-kb"),
            "{raw}"
        );
    }
}

/// `--api-key " "` (or a blank BMOE_API_KEY) is a usage error, before the
/// model loads.
#[test]
fn a_blank_api_key_is_refused_with_exit_2() {
    let m = e8k2().to_str().unwrap();
    for key in ["", " ", " sesame"] {
        let out = common::bmoe_within(&["serve", "-m", m, "--port", "0", "--api-key", key], 60);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{key:?}: {}",
            common::stderr(&out)
        );
        assert!(
            common::stderr(&out).contains("--api-key"),
            "{}",
            common::stderr(&out)
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["serve", "-m", m, "--port", "0"])
        .env("BMOE_CACHE_DIR", smollm2().parent().unwrap())
        .env("BMOE_API_KEY", "  ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
}

/// The first stderr lines of `bmoe serve ARGS` up to its listening line (or
/// its end), the server killed after.
fn serve_stderr_until_listening(args: &[&str]) -> String {
    let m = e8k2().to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["serve", "-m", m, "--port", "0", "-c", "256", "-t", "2"])
        .args(args)
        .env("BMOE_CACHE_DIR", smollm2().parent().unwrap())
        .env_remove("BMOE_API_KEY")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let t0 = Instant::now();
    let mut lines = String::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60).saturating_sub(t0.elapsed())) {
        lines.push_str(&line);
        lines.push('\n');
        if line.contains("listening on") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(lines.contains("listening on"), "{lines}");
    lines
}

/// A server on a non-loopback address with no key says so on stderr.
#[test]
fn a_non_loopback_host_without_a_key_is_warned_about() {
    let open = serve_stderr_until_listening(&["--host", "0.0.0.0"]);
    assert!(
        open.contains("warning: --host 0.0.0.0 is not a loopback address and no --api-key"),
        "{open}"
    );
    let keyed = serve_stderr_until_listening(&["--host", "0.0.0.0", "--api-key", "sesame"]);
    assert!(!keyed.contains("warning: --host"), "{keyed}");
    let local = serve_stderr_until_listening(&[]);
    assert!(!local.contains("warning: --host"), "{local}");
}
