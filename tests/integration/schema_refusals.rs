//! Issue 64's schemas through the real server (a zoo model, random
//! weights): a schema whose grammar build ran away (22 GB, killed) is a 400
//! at once on every route that takes one; schemas the grammar could not
//! honour (a 200 whose content did not validate, or a 500) are a 400
//! naming the keyword; an enum of 100k values (which held the engine 76 s)
//! is a 400 at once and a plain request behind it is not kept waiting; what
//! is constrained validates, in whole characters.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::zoo_model;
use crate::serve::Server;

fn server() -> Server {
    Server::start_on(zoo_model("qwen3moe", "f32"), &["-c", "512"])
}

/// The schema that grew llama.cpp's grammar build to 22 GB.
fn bomb() -> Value {
    json!({"type": "string", "minLength": 10, "maxLength": 2})
}

fn chat_format(schema: &Value) -> Value {
    json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

/// `body` posted to `path`: a 400 within a few seconds whose error names
/// `param` and mentions `keyword`.
fn assert_refused(server: &Server, path: &str, body: &Value, param: &str, keyword: &str) {
    let t = Instant::now();
    let (status, reply) = server.post(path, body);
    let took = t.elapsed();
    assert_eq!(status, 400, "{path} {keyword}: {reply}");
    assert!(took < Duration::from_secs(5), "{path} {keyword}: {took:?}");
    let error = if reply["error"].is_object() {
        &reply["error"]
    } else {
        &reply
    };
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("\"{keyword}\"")),
        "{path}: {reply}"
    );
    if let Some(p) = error.get("param").filter(|p| !p.is_null()) {
        assert_eq!(p, param, "{path}: {reply}");
    }
}

#[test]
fn a_runaway_schema_is_a_fast_400_on_every_route() {
    let s = server();
    let tool = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"a": bomb()}, "required": ["a"]}}}]);
    assert_refused(
        &s,
        "/v1/chat/completions",
        &chat_format(&bomb()),
        "response_format",
        "minLength",
    );
    let responses = json!({"input": "x", "max_output_tokens": 8,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": bomb()}}});
    assert_refused(&s, "/v1/responses", &responses, "text.format", "minLength");
    for choice in ["required", "auto"] {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
            "tools": tool, "tool_choice": choice});
        assert_refused(&s, "/v1/chat/completions", &body, "tools", "minLength");
    }
    let anthropic = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": tool[0]["function"]["parameters"]}]});
    assert_refused(&s, "/v1/messages", &anthropic, "tools", "minLength");
    // Under auto, a tool too large to constrain (Claude Code's Workflow
    // tool has a script of maxLength 524288) leaves the calls unconstrained:
    // the request is answered, at once.
    let big = json!([{"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"script": {"type": "string", "maxLength": 524288}}}}}]);
    let t0 = std::time::Instant::now();
    let (status, body) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "tools": big}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    // The server is still whole: a plain request is answered.
    let (status, body) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn schemas_the_grammar_cannot_honour_are_a_400_naming_the_keyword() {
    let s = server();
    for (schema, keyword) in [
        (json!({"type": "string", "pattern": "(("}), "pattern"),
        (json!({"type": "string", "pattern": "^(a)\\1$"}), "pattern"),
        (
            json!({"type": "string", "pattern": "^(?=a)[a-z]+$"}),
            "pattern",
        ),
        (
            json!({"type": "integer", "minimum": 10, "maximum": 2}),
            "maximum",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "allOf",
        ),
        (json!({"not": {}}), "not"),
        (json!({"type": "integer", "const": "abc"}), "const"),
        (
            json!({"type": "integer", "exclusiveMinimum": 5, "maximum": 5}),
            "maximum",
        ),
        (json!({"type": "string", "minLength": 1000000}), "minLength"),
        (json!({"type": "array", "minItems": 1000000}), "minItems"),
    ] {
        assert_refused(
            &s,
            "/v1/chat/completions",
            &chat_format(&schema),
            "response_format",
            keyword,
        );
    }
}

#[test]
fn an_enum_of_100k_values_is_a_fast_400_and_holds_no_one() {
    let s = server();
    let many: Vec<String> = (0..100_000).map(|i| format!("v{i:06}")).collect();
    let schema = json!({"type": "string", "enum": many});
    assert_refused(
        &s,
        "/v1/chat/completions",
        &chat_format(&schema),
        "response_format",
        "enum",
    );
    let plain = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 16});
    let t = Instant::now();
    let (status, body) = s.post("/v1/chat/completions", &plain);
    assert_eq!(status, 200, "{body}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Strings under `maxLength` from random weights, sampled hot over several
/// seeds: each reply is JSON that validates (whole characters, none split
/// into U+FFFD, and no more of them than the bound).
#[test]
fn constrained_strings_are_whole_characters_that_validate() {
    let s = server();
    let schema = json!({"type": "string", "maxLength": 16});
    let validator = jsonschema::validator_for(&schema).unwrap();
    for seed in 0..12 {
        let mut body = chat_format(&schema);
        body["max_tokens"] = 64.into();
        body["temperature"] = 1.5.into();
        body["seed"] = seed.into();
        let (status, reply) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        let choice = &reply["choices"][0];
        if choice["finish_reason"] != "stop" {
            continue;
        }
        let content = choice["message"]["content"].as_str().unwrap_or_default();
        assert!(!content.contains('\u{fffd}'), "seed {seed}: {content:?}");
        let v: Value = serde_json::from_str(content)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {content:?}"));
        assert!(validator.is_valid(&v), "seed {seed}: {content:?}");
    }
}

/// A `json_schema` reply cut by `max_tokens` keeps `finish_reason`
/// `length` and says in its notes that its JSON may not validate.
#[test]
fn a_schema_reply_cut_short_says_it_may_not_validate() {
    let s = server();
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let mut body = chat_format(&schema);
    body["max_tokens"] = 3.into();
    let (status, reply) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
    let notes = reply["bmoe"]["notes"].to_string();
    assert!(notes.contains("may not parse or validate"), "{reply}");
}

/// Schemas that pass the check, sampled hot from random weights: every
/// reply that ends validates (the grammar admits only the schema's
/// documents: patterns, exclusive integer bounds, merged allOf, a tagged
/// oneOf, a tuple, an enum beside a type list).
#[test]
fn what_passes_the_check_validates_when_sampled_hot() {
    let s = server();
    let schemas = [
        json!({"type": "string", "pattern": "^[a-c]{2,4}-(?:x|yz)[0-9]?$"}),
        json!({"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 40}),
        json!({"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}},
            {"properties": {"b": {"enum": [1, 2]}}, "required": ["b"]}]}),
        json!({"oneOf": [
            {"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k", "n"]},
            {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]}),
        json!({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}]}),
        json!({"type": ["string", "null"], "enum": ["x", null]}),
        json!({"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3}),
    ];
    let mut checked = 0;
    for schema in &schemas {
        let validator = jsonschema::validator_for(schema).unwrap();
        for seed in 0..3 {
            let mut body = chat_format(schema);
            body["max_tokens"] = 48.into();
            body["temperature"] = 1.5.into();
            body["seed"] = seed.into();
            let (status, reply) = s.post("/v1/chat/completions", &body);
            assert_eq!(status, 200, "{schema}: {reply}");
            let choice = &reply["choices"][0];
            if choice["finish_reason"] != "stop" {
                continue;
            }
            let content = choice["message"]["content"].as_str().unwrap_or_default();
            let v: Value = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("{schema} seed {seed}: {e}: {content:?}"));
            assert!(validator.is_valid(&v), "{schema} seed {seed}: {content:?}");
            checked += 1;
        }
    }
    assert!(checked >= schemas.len(), "only {checked} replies ended");
}
