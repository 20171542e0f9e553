//! `bmoe serve` on the E8K2 fixture, driven with raw HTTP/1.0 over loopback
//! (and, in `openai_client`, with the official Python client): answers equal
//! to `bmoe run`'s, the KV prefix reused, streaming, stop strings, seeded
//! sampling, tools, every error with its status and body, the queue, the API key, a
//! client that goes away, and a clean stop on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::{self, e8k2, smollm2, PROSE};

/// A running server, killed when dropped.
pub struct Server {
    pub(crate) child: Child,
    pub port: u16,
    /// The server's stderr lines after it started listening.
    pub log: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
    /// Its stderr lines up to the listening one: the engine thread logs
    /// beside the listener, so a line of its start may come before it.
    pub started: Vec<String>,
}

impl Server {
    /// `bmoe serve -m E8K2 --port 0 -c 512 EXTRA...`, once it listens.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_on(e8k2(), &[&["-c", "512"], extra].concat())
    }

    /// `bmoe serve -m MODEL --port 0 -t 2 EXTRA...`, once it listens (`-t 2`
    /// unless EXTRA gives `-t`); the prompt cache only where a test asks for it
    /// (tests/prompt_cache.rs): a state another test left would change the
    /// figures of this one.
    pub fn start_on(model: impl AsRef<std::path::Path>, extra: &[&str]) -> Server {
        let m = model.as_ref().to_str().unwrap();
        // A default flag and its value, unless EXTRA gives that flag itself.
        let default = |flag: &'static str, value: &'static str| {
            (!extra.contains(&flag)).then_some([flag, value])
        };
        let child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["serve", "-m", m, "--port", "0"])
            .args(default("-t", "2").into_iter().flatten())
            .args(default("--prompt-cache", "off").into_iter().flatten())
            .args(extra)
            .env("BMOE_CACHE_DIR", smollm2().parent().expect("cache dir"))
            .env_remove("RUST_LOG")
            .env_remove("BMOE_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start bmoe serve");
        // Killed and reaped by Drop should it never listen.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut server = Server {
            child,
            port: 0,
            log: std::sync::Mutex::new(rx),
            started: Vec::new(),
        };
        let err = server.child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let t0 = Instant::now();
        loop {
            let line = server
                .log
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60).saturating_sub(t0.elapsed()))
                .unwrap_or_else(|_| panic!("bmoe serve did not start listening"));
            server.started.push(line.clone());
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                server.port = rest.split('/').next().unwrap().parse().expect("port");
                return server;
            }
        }
    }

    /// One request; the status and the body.
    pub fn request(&self, method: &str, path: &str, body: &str, headers: &[&str]) -> (u16, String) {
        let mut s = self.send(method, path, body, headers);
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read the response");
        split_response(&raw)
    }

    /// One request; the whole response, head and body.
    pub fn raw(&self, method: &str, path: &str, body: &str, headers: &[&str]) -> String {
        let mut s = self.send(method, path, body, headers);
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read the response");
        raw
    }

    /// POST a JSON body; the status and the parsed body.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.request("POST", path, &body.to_string(), &[]);
        let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body: {text}"));
        (status, v)
    }

    /// The connection after sending a request (HTTP/1.0: the body ends at close).
    pub fn send(&self, method: &str, path: &str, body: &str, headers: &[&str]) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        // Long enough for a queued request on a loaded host; a hang still fails.
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut req = format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("send the head");
        s.write_all(body.as_bytes()).expect("send the body");
        s
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, and the exit status within `secs`.
    pub fn terminate(mut self, secs: u64) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        common::wait_within(&mut self.child, secs, "bmoe serve after SIGTERM")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn split_response(raw: &str) -> (u16, String) {
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line in {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// The `data:` payloads of a server-sent event stream.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

pub fn chat_body(content: &str, extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": content}]});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

pub fn completion(prompt: &str, extra: Value) -> Value {
    let mut b = json!({"prompt": prompt});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

/// A prompt longer than a batch (`--ubatch 16`) is read whole, its chunks
/// decoded in turn, fresh and after a reused prefix: the greedy text is
/// run's. Issue 67: the chunks before the last were once skipped (the
/// prompt silently cut to its last chunk) and a rest longer than a batch
/// after a reused prefix failed its decode (a stream ending in a 500 error).
#[test]
fn a_prompt_longer_than_a_batch_is_read_whole() {
    let server = Server::start(&["--ubatch", "16"]);
    let short = "Once upon a time, in a small village by the sea, there lived an old fisherman";
    let long = format!(
        "{short} who told stories to the children every evening, and one of those \
         stories was about a lighthouse keeper who"
    );
    for prompt in [short, long.as_str()] {
        let ran = common::e8k2_cli(prompt, 12, &["--ignore-eos"]);
        let expected = common::stdout(&ran).trim_end_matches('\n').to_string();
        let (s, v) = server.post(
            "/v1/completions",
            &completion(prompt, json!({"max_tokens": 12})),
        );
        assert_eq!(s, 200, "{v}");
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 16, "{v}");
        assert_eq!(v["choices"][0]["text"], expected.as_str(), "{prompt:?}");
    }
}

#[test]
fn completions_match_run_reuse_the_prefix_and_stream_the_same_text() {
    let server = Server::start(&["--cache-mb", "25%"]);
    let (s, health) = server.request("GET", "/health", "", &[]);
    assert_eq!((s, health.contains("\"ok\"")), (200, true));
    let (s, models) = server.request("GET", "/v1/models", "", &[]);
    assert!(s == 200 && models.contains("E8K2"), "{models}");
    // Issue 67: the window a request has, where clients look for it (-c 512).
    let entry = &serde_json::from_str::<Value>(&models).unwrap()["data"][0];
    assert_eq!(entry["context_length"], 512, "{models}");
    assert_eq!(entry["max_model_len"], 512, "{models}");

    let ran = common::e8k2_cli(PROSE, 12, &["--ignore-eos"]);
    let expected = common::stdout(&ran).trim_end_matches('\n').to_string();
    let (s, a) = server.post(
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 12})),
    );
    assert_eq!(s, 200, "{a}");
    assert_eq!(
        a["choices"][0]["text"],
        expected.as_str(),
        "the server's greedy text is run's"
    );
    assert_eq!(a["usage"]["completion_tokens"], 12);
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    // The same prompt again: all but its last token come from the KV cache.
    let (_, b) = server.post(
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 12})),
    );
    assert_eq!(b["choices"][0]["text"], a["choices"][0]["text"]);
    assert_eq!(b["bmoe"]["prefilled_tokens"], 1, "{b}");
    assert!(b["bmoe"]["reused_tokens"].as_u64().unwrap() > 5);

    let body = completion(
        PROSE,
        json!({"max_tokens": 12, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let (s, raw) = server.request("POST", "/v1/completions", &body.to_string(), &[]);
    assert_eq!(s, 200);
    let data = sse_data(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, expected);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 12);
}

#[test]
fn chat_streams_stops_at_stop_strings_and_seeds_reproduce() {
    let server = Server::start(&[]);
    let ask = |extra: Value| {
        server.post(
            "/v1/chat/completions",
            &chat_body("Tell me a story.", extra),
        )
    };
    let (s, greedy) = ask(json!({"max_tokens": 16}));
    assert_eq!(s, 200, "{greedy}");
    let text = greedy["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(greedy["choices"][0]["message"]["role"], "assistant");
    assert_eq!(greedy["object"], "chat.completion");
    // A stop string from the middle of the greedy text cuts it there.
    let word = text
        .split_whitespace()
        .nth(2)
        .expect("three words")
        .to_string();
    let (_, stopped) = ask(json!({"max_tokens": 16, "stop": [word.clone()]}));
    let cut = stopped["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(cut, &text[..text.find(&word).unwrap()]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    // Seeded draws repeat; the stream carries the same text as deltas.
    let drawn = |seed: u32| {
        ask(json!({"max_tokens": 16, "temperature": 1.2, "seed": seed})).1["choices"][0]["message"]
            ["content"]
            .clone()
    };
    assert_eq!(drawn(7), drawn(7));
    let body = chat_body(
        "Tell me a story.",
        json!({"max_tokens": 16, "stream": true}),
    );
    let (_, raw) = server.request("POST", "/v1/chat/completions", &body.to_string(), &[]);
    let data = sse_data(&raw);
    let chunks: Vec<Value> = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn bad_requests_get_openai_errors_with_their_status() {
    let server = Server::start(&["--body-limit-kb", "16"]);
    let check = |body: &str, want: u16, param: Option<&str>| {
        let (s, text) = server.request("POST", "/v1/chat/completions", body, &[]);
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON error body: {text}"));
        assert_eq!(s, want, "{body:.80} -> {text}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{text}");
        }
    };
    check("{not json", 400, None);
    check(r#"{"messages": []}"#, 400, Some("messages"));
    check(
        &chat_body("x", json!({"temperature": -1})).to_string(),
        400,
        Some("temperature"),
    );
    let long = "word ".repeat(5000);
    check(&chat_body(&long, json!({})).to_string(), 413, None);
    let over_ctx = "word ".repeat(700);
    let (s, v) = server.post("/v1/completions", &completion(&over_ctx, json!({})));
    assert_eq!(s, 400);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long: "), "{v}");
    assert!(message.contains("-c 512"), "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let (s, capped) = server.post(
        "/v1/completions",
        &completion(PROSE, json!({"max_tokens": 100000, "stop": [" "]})),
    );
    assert_eq!(s, 200);
    assert!(
        capped["bmoe"]["notes"][0]
            .as_str()
            .unwrap()
            .contains("capped"),
        "{capped}"
    );
    let (s, _) = server.request("GET", "/v1/nothing", "", &[]);
    assert_eq!(s, 404);
}

#[test]
fn the_api_key_guards_every_route_but_health() {
    let server = Server::start(&["--api-key", "sesame"]);
    let body = completion(PROSE, json!({"max_tokens": 2})).to_string();
    let (s, text) = server.request("POST", "/v1/completions", &body, &[]);
    assert_eq!(s, 401, "{text}");
    assert!(text.contains("authentication_error"));
    let (s, _) = server.request(
        "POST",
        "/v1/completions",
        &body,
        &["Authorization: Bearer wrong"],
    );
    assert_eq!(s, 401);
    let (s, _) = server.request(
        "POST",
        "/v1/completions",
        &body,
        &["Authorization: Bearer sesame"],
    );
    assert_eq!(s, 200);
    let (s, _) = server.request("POST", "/v1/completions", &body, &["x-api-key: sesame"]);
    assert_eq!(s, 200, "Anthropic's key header is taken too");
    let (s, text) = server.request("POST", "/v1/messages", "{}", &["x-api-key: wrong"]);
    assert_eq!(s, 401);
    assert!(
        text.starts_with(r#"{"type":"error","error":{"type":"authentication_error""#),
        "Anthropic's error shape on its route: {text}"
    );
    assert_eq!(server.request("GET", "/metrics", "", &[]).0, 401);
    assert_eq!(server.request("GET", "/health", "", &[]).0, 200);
    // A request naming another model is answered by the one loaded (clients
    // configured for another name keep working); the reply says which.
    let named = completion(PROSE, json!({"max_tokens": 2, "model": "gpt-4o"})).to_string();
    let (s, text) = server.request("POST", "/v1/completions", &named, &["x-api-key: sesame"]);
    assert_eq!(s, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_ne!(v["model"], "gpt-4o", "{v}");
    assert!(v["model"].as_str().unwrap().contains("E8K2"), "{v}");
    let lower = ["authorization: bearer sesame"];
    let (s, text) = server.request("POST", "/v1/completions", &body, &lower);
    assert_eq!(s, 200, "the scheme's case does not matter: {text}");

    // A browser's CORS preflight carries no key and is answered.
    let raw = server.raw(
        "OPTIONS",
        "/v1/chat/completions",
        "",
        &[
            "Origin: http://localhost:3000",
            "Access-Control-Request-Method: POST",
            "Access-Control-Request-Headers: authorization, content-type",
        ],
    );
    let head = raw.to_ascii_lowercase();
    assert!(split_response(&raw).0 < 300, "{raw}");
    assert!(head.contains("access-control-allow-origin: *"), "{raw}");
    assert!(head.contains("access-control-allow-methods"), "{raw}");

    // A body cut short is a bad request, not one over the limit.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sesame\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(b"{\"prompt\": \"hi\"").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    if !raw.is_empty() {
        assert_eq!(split_response(&raw).0, 400, "{raw}");
    }
    let (_, metrics) = server.request("GET", "/metrics", "", &["x-api-key: sesame"]);
    assert!(!metrics.contains("status=\"413\""), "{metrics}");
}
