//! bmoe's call parsers (`bmoe::chat::tool_calls`) on the recorded replies
//! (tests/data/templates/recorded_calls.json), each family's format detected
//! from its template as `bmoe serve` does: one line per family (the file,
//! the format, microseconds per parse, ok or what differs), the same table
//! as shim.cpp prints for llama.cpp's own parser. Run by run.sh.

use std::time::Instant;

use bmoe::chat::tool_calls::{parse_with_tools, CallFormat};
use serde_json::Value;

const REPEATS: u32 = 2000;

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| {
        eprintln!("chat_parser: {path}: {e}");
        std::process::exit(2)
    })
}

fn main() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates");
    let recorded: Value = serde_json::from_str(&read(&format!("{dir}/recorded_calls.json")))
        .expect("recorded_calls.json is JSON");
    let conversations: Value = serde_json::from_str(&read(&format!("{dir}/conversations.json")))
        .expect("conversations.json is JSON");
    let tools = &conversations["tools"];
    let replies = recorded["replies"].as_array().cloned().unwrap_or_default();
    let mut ok = 0;
    for r in &replies {
        let file = r["file"].as_str().unwrap_or("");
        let format = CallFormat::detect(&read(&format!("{dir}/{file}")));
        let reply = r["reply"].as_str().unwrap_or("");
        let t0 = Instant::now();
        let mut parsed = parse_with_tools(format, reply, Some(tools));
        for _ in 1..REPEATS {
            parsed = std::hint::black_box(parse_with_tools(format, reply, Some(tools)));
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(REPEATS);
        let calls: Vec<Value> = parsed
            .calls
            .iter()
            .map(|c| {
                let args: Value = serde_json::from_str(&c.arguments).unwrap_or_default();
                serde_json::json!({"name": c.name, "arguments": args})
            })
            .collect();
        let verdict = if Value::Array(calls.clone()) == r["calls"] {
            ok += 1;
            "ok".to_string()
        } else {
            format!("differs: {}", Value::Array(calls))
        };
        println!(
            "{file:<52} {:<22} {us:8.1} us  {verdict:.160}",
            format.name()
        );
    }
    println!(
        "bmoe chat::tool_calls: {ok} of {} families' calls parsed back",
        replies.len()
    );
}
