//! `bmoe serve` as coding agents and their SDKs speak to it: OpenAI's
//! Responses API (the official client, and malformed bodies over raw HTTP),
//! Anthropic's Messages as Claude Code sends them, `count_tokens`,
//! `--served-name` and the request log at `-v` (issue 50).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::serve::Server;
use super::serve_lifecycle::run_client_script;

#[test]
fn the_openai_clients_responses_api_works() {
    let server = Server::start(&["--served-name", "local-model,other-name"]);
    let url = format!("http://127.0.0.1:{}/v1", server.port);
    run_client_script("responses_client.py", &[&url], "responses client: ok");
}

#[test]
fn the_anthropic_clients_count_tokens_works() {
    let server = Server::start(&[]);
    let url = format!("http://127.0.0.1:{}", server.port);
    run_client_script(
        "anthropic_count_tokens.py",
        &[&url],
        "anthropic count_tokens: ok",
    );
}

/// A conversation past `-c 512` sent by the official Python clients to
/// /v1/messages, /v1/chat/completions and /v1/responses, whole and streamed:
/// each raises its own 400 type in its dialect's words, /v1/models gives the
/// window and /metrics counts the 400s and no 5xx (tests/integration/
/// over_context_client.py).
#[test]
fn the_official_clients_raise_their_over_context_errors() {
    let server = Server::start(&[]);
    let url = format!("http://127.0.0.1:{}", server.port);
    run_client_script(
        "over_context_client.py",
        &[&url, "512"],
        "over-context clients: ok",
    );
}

/// Malformed Responses bodies: each a 400 naming the field, within a
/// generous bound (never a 500 or a hang), and the server answers after.
#[test]
fn malformed_responses_bodies_get_a_400_naming_the_field() {
    let server = Server::start(&[]);
    let cases = [
        ("{not json", None, "invalid JSON"),
        ("[1]", None, "JSON object"),
        ("{}", Some("input"), "input is required"),
        (
            r#"{"input": {"role": "user"}}"#,
            Some("input"),
            "input must be a string or a list",
        ),
        (
            r#"{"input": [{"type": "function_call_output", "output": "x"}]}"#,
            Some("input"),
            "input[0].call_id is required",
        ),
        (
            r#"{"input": [{"role": "user", "content": [{"type": "input_image"}]}]}"#,
            Some("input"),
            "\"input_image\"",
        ),
        (
            r#"{"input": "hi", "tools": [{"type": "function", "name": "a b"}]}"#,
            Some("tools"),
            "tools[0].name",
        ),
        (
            r#"{"input": "hi", "tool_choice": {"type": "function", "name": "nope"}}"#,
            Some("tool_choice"),
            "nope",
        ),
        (
            r#"{"input": "hi", "max_output_tokens": -5}"#,
            Some("max_output_tokens"),
            "give at least 1",
        ),
        (
            r#"{"input": "hi", "temperature": "warm"}"#,
            Some("temperature"),
            "temperature must be a number",
        ),
        (
            r#"{"input": "hi", "stream": "yes"}"#,
            Some("stream"),
            "stream must be true or false",
        ),
        (
            r#"{"input": "hi", "previous_response_id": "resp_x"}"#,
            Some("previous_response_id"),
            "keeps no responses",
        ),
    ];
    for (body, param, says) in cases {
        let t0 = Instant::now();
        let (status, text) = server.request("POST", "/v1/responses", body, &[]);
        assert!(t0.elapsed() < Duration::from_secs(60), "{body}: no hang");
        assert_eq!(status, 400, "{body} -> {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON: {text}"));
        assert_eq!(v["error"]["param"].as_str(), param, "{body} -> {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(says), "{body}: {m:?} lacks {says:?}");
    }
    let (status, v) = server.post(
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 2}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["output_tokens"], 2, "{v}");
}

/// What Claude Code 2.1 sends: `?beta=true`, an `anthropic-beta` header, a
/// `system` list, a `system`-role entry inside `messages`, 12 tools, adaptive
/// thinking, `context_management`, `output_config`, `metadata` and
/// `max_tokens: 32000` (over the context: capped, said in a header).
fn claude_code_body(stream: bool) -> Value {
    let tools: Vec<Value> = (0..12)
        .map(|i| json!({"name": format!("T{i}"), "description": "x", "input_schema": {"type": "object"}}))
        .collect();
    json!({"model": "local-model", "max_tokens": 32000, "stream": stream,
        "system": [{"type": "text", "text": "You are a coding agent."},
                   {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello in one word."}]}],
        "tools": tools, "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "user_abc_account__session_1"}})
}

const BETA: &str = "anthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,some-future-beta";

#[test]
fn claude_codes_request_is_answered_whole_and_streamed() {
    let server = Server::start(&[]);
    let path = "/v1/messages?beta=true";
    let head_and_body = |stream: bool| {
        let raw = server.raw(
            "POST",
            path,
            &claude_code_body(stream).to_string(),
            &[BETA, "anthropic-version: 2023-06-01"],
        );
        let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{raw}"
        );
        let capped = head
            .lines()
            .find_map(|l| l.strip_prefix("x-bmoe-max-tokens: "))
            .unwrap_or_else(|| panic!("the cap said in a header: {head}"));
        let capped: u32 = capped.trim().parse().unwrap();
        assert!(
            capped > 0 && capped < 512,
            "capped to what -c 512 leaves: {capped}"
        );
        body.to_string()
    };
    let whole: Value = serde_json::from_str(&head_and_body(false)).unwrap();
    assert_eq!(whole["type"], "message", "{whole}");
    assert!(
        whole["usage"]["input_tokens"].as_u64().unwrap() > 50,
        "{whole}"
    );
    let streamed = head_and_body(true);
    assert!(streamed.contains("event: message_start"), "{streamed}");
    assert!(streamed.contains("event: message_stop"), "{streamed}");
    assert!(!streamed.contains("event: error"), "{streamed}");
    // count_tokens on the same body says the prompt tokens the reply reported.
    let mut count_body = claude_code_body(false);
    count_body.as_object_mut().unwrap().remove("max_tokens");
    let (status, text) = server.request(
        "POST",
        "/v1/messages/count_tokens?beta=true",
        &count_body.to_string(),
        &[BETA],
    );
    assert_eq!(status, 200, "{text}");
    let counted: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        counted,
        json!({"input_tokens": whole["usage"]["input_tokens"]})
    );
}

/// `-v` logs each request: its method, path and status (tower-http's trace
/// layer), and the engine's tokens and times inside the request's span.
#[test]
fn each_request_is_logged_at_v() {
    let server = Server::start(&["-v", "--served-name", "local-model"]);
    let (status, v) = server.post(
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 2}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "local-model");
    let (status, _) = server.request("GET", "/v1/nope", "", &[]);
    assert_eq!(status, 404);
    let t0 = Instant::now();
    let (mut answered, mut ok, mut missing) = (false, false, false);
    while !(answered && ok && missing) && t0.elapsed() < Duration::from_secs(30) {
        let got = server
            .log
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(1));
        let Ok(line) = got else {
            continue;
        };
        let ours = line.contains("method=POST") && line.contains("uri=/v1/responses");
        answered |= ours
            && line.contains("request answered")
            && line.contains("prompt_tokens=")
            && line.contains("cached_tokens=")
            && line.contains("first_token_ms=")
            && line.contains("total_ms=");
        ok |= ours && line.contains("finished processing request") && line.contains("status=200");
        missing |= line.contains("uri=/v1/nope") && line.contains("status=404");
    }
    assert!(
        answered && ok && missing,
        "answered {answered}, 200 {ok}, 404 {missing}"
    );
}

/// A blank or repeated `--served-name` is a usage error (exit 2) before the
/// model loads.
#[test]
fn a_blank_or_repeated_served_name_is_refused_with_exit_2() {
    let m = super::common::e8k2();
    let m = m.to_str().unwrap();
    for names in ["a,,b", " a", "a,a"] {
        let args = ["serve", "-m", m, "--port", "0", "--served-name", names];
        let out = super::common::bmoe_within(&args, 60);
        let err = super::common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{names:?}: {err}");
        assert!(err.contains("--served-name"), "{err}");
    }
}
