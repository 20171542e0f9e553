use axum::http::StatusCode;
use serde_json::json;

use super::*;

fn req(v: Value) -> Result<MessagesRequest, ApiError> {
    parse(
        v.to_string().as_bytes(),
        &SamplingParams::default(),
        Purpose::Reply,
    )
}

fn messages(r: &MessagesRequest) -> &[Message] {
    match &r.spec.prompt {
        PromptSpec::Chat { messages, .. } => messages,
        PromptSpec::Text(_) => panic!("a chat"),
    }
}

/// The message a refusal carries (it must be a 400).
fn refusal(v: Value) -> String {
    let e = req(v).unwrap_err();
    assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
    e.message
}

fn hi() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[test]
fn a_plain_request_maps_its_settings() {
    let r = req(json!({"model": "m", "max_tokens": 7, "messages": hi(),
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"],
        "stream": true, "metadata": {"user_id": "ann"}}))
    .unwrap();
    assert_eq!(r.spec.max_tokens, Some(7));
    assert_eq!(r.spec.sampling.temperature, 0.5);
    assert_eq!((r.spec.sampling.top_p, r.spec.sampling.top_k), (0.9, 40));
    assert_eq!(r.spec.stop, vec!["END".to_string()]);
    assert!(r.spec.stream);
    assert_eq!(r.spec.requester, "ann");
    assert!(matches!(
        r.spec.prompt,
        PromptSpec::Chat { tools: None, .. }
    ));
    assert_eq!(messages(&r), &[Message::new("user", "hi")]);
}

#[test]
fn system_as_string_or_text_blocks_comes_first() {
    let s = req(json!({"max_tokens": 1, "system": "be brief", "messages": hi()})).unwrap();
    assert_eq!(messages(&s)[0], Message::new("system", "be brief"));
    let blocks = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]);
    let b = req(json!({"max_tokens": 1, "system": blocks, "messages": hi()})).unwrap();
    assert_eq!(messages(&b)[0], Message::new("system", "a\nb"));
    assert_eq!(messages(&b)[1].role, "user");
}

#[test]
fn an_empty_system_list_is_no_system_prompt() {
    let empty = req(json!({"max_tokens": 1, "system": [], "messages": hi()})).unwrap();
    let absent = req(json!({"max_tokens": 1, "messages": hi()})).unwrap();
    assert_eq!(messages(&empty), messages(&absent));
    assert_eq!(messages(&empty)[0].role, "user");
}

#[test]
fn tool_names_are_checked_as_on_the_openai_route() {
    let tool = |name: Value| json!({"name": name, "input_schema": {"type": "object"}});
    let body = |tools: Value| json!({"max_tokens": 1, "messages": hi(), "tools": tools});
    assert_refused(&[
        (body(json!([tool(json!(""))])), "tools[0].name is empty"),
        (
            body(json!([tool(json!("a\nb"))])),
            "tools[0].name \"a\\nb\" holds '\\n'",
        ),
        (
            body(json!([tool(json!("f")), tool(json!("f"))])),
            "tools[1].name \"f\" is also tools[0].name",
        ),
        (
            body(json!([tool(json!(3))])),
            "tools[0].name must be a string",
        ),
    ]);
    assert!(req(body(json!([tool(json!("a".repeat(128)))]))).is_ok());
}

#[test]
fn tool_use_and_tool_result_become_tool_calls_and_tool_messages() {
    let conv = json!([
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
            {"type": "text", "text": "and tomorrow?"}]},
    ]);
    let r = req(json!({"max_tokens": 1, "messages": conv})).unwrap();
    let m = messages(&r);
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "user"]);
    assert_eq!(m[1].content, "Let me look.");
    assert_eq!(
        m[1].extra["tool_calls"],
        json!([{"id": "toolu_1", "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Oslo"}}}])
    );
    assert_eq!(
        (m[2].content.as_str(), &m[2].extra["tool_call_id"]),
        ("rain", &json!("toolu_1"))
    );
    assert_eq!(m[3].content, "Error: boom");
    assert_eq!(m[4].content, "and tomorrow?");
}

#[test]
fn tools_become_openai_shaped_functions_unless_tool_choice_is_none() {
    let tools = json!([{"name": "weather", "description": "Weather now",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let r = req(json!({"max_tokens": 1, "messages": hi(), "tools": tools,
        "tool_choice": {"type": "tool", "name": "weather"}}))
    .unwrap();
    let PromptSpec::Chat { tools: Some(t), .. } = &r.spec.prompt else {
        panic!("tools")
    };
    assert_eq!(
        t,
        &json!([{"type": "function", "function": {"name": "weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    );
    let none = req(json!({"max_tokens": 1, "messages": hi(), "tools": tools,
        "tool_choice": {"type": "none"}}))
    .unwrap();
    assert!(matches!(
        none.spec.prompt,
        PromptSpec::Chat { tools: None, .. }
    ));
}

/// Each body is refused with a 400 whose message names the field at fault
/// and no Rust type.
fn assert_refused(cases: &[(Value, &str)]) {
    for (body, expected) in cases {
        let message = refusal(body.clone());
        assert!(
            message.contains(expected),
            "{body}: {message:?} lacks {expected:?}"
        );
        for rust in ["i64", "f32", "u32", "Value", "enum", "struct"] {
            assert!(
                !message.contains(rust),
                "{body}: {message:?} names a Rust type"
            );
        }
    }
}

#[test]
fn bad_settings_name_the_field_in_the_requests_own_terms() {
    assert_refused(&[
        (json!({"messages": hi()}), "max_tokens is required"),
        (json!({"max_tokens": 0, "messages": hi()}), "max_tokens"),
        (
            json!({"max_tokens": "5", "messages": hi()}),
            "max_tokens must be a whole number",
        ),
        (json!({"max_tokens": 5}), "messages is required"),
        (
            json!({"max_tokens": 5, "messages": []}),
            "messages is empty",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "temperature": -1}),
            "temperature",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "temperature": "hot"}),
            "temperature must be a number",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "stream": "yes"}),
            "stream must be true or false",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "stop_sequences": "x"}),
            "stop_sequences must be",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "stop_sequences": vec!["x"; 17]}),
            "stop_sequences has 17",
        ),
    ]);
    let e = parse(b"{not json", &SamplingParams::default(), Purpose::Reply).unwrap_err();
    assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
}

#[test]
fn bad_messages_and_tools_name_the_field_in_the_requests_own_terms() {
    assert_refused(&[
        (
            json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
            "messages holds only system entries",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user"}]}),
            "messages[0].content is required",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]}),
            "messages[0].content must be",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages[0].content[0]: blocks of type \"image\"",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}),
            "\"document\"",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role is \"robot\"",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]}),
            "messages[0].content[0].id is required",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
            "tool_use_id is required",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "system": 3}),
            "system must be",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "tools": [{"name": "f"}]}),
            "tools[0].input_schema is required",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "thinking": {"type": "sometimes"}}),
            "thinking.type \"sometimes\"",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "tool_choice": {"type": "sometimes"}}),
            "tool_choice.type",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "tools": [], "tool_choice": {"type": "tool", "name": "g"}}),
            "tool_choice.name \"g\"",
        ),
        (
            json!({"max_tokens": 5, "messages": hi(), "metadata": {"user_id": 3}}),
            "metadata.user_id",
        ),
        (json!([1, 2]), "the body must be a JSON object"),
    ]);
}

/// Claude Code 2.1's request shape: a `system` list, a `system`-role entry
/// inside `messages`, `thinking`, `context_management`, `output_config`,
/// `metadata`, a server tool beside a function one, and earlier reasoning.
#[test]
fn claude_codes_request_shape_is_taken() {
    let r = req(json!({"model": "local-model", "max_tokens": 32000, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "system", "content": "Extra rules."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "Hello"}]},
            {"role": "system", "content": [{"type": "text", "text": "More rules."}]},
            {"role": "user", "content": "again"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": []}, "output_config": {"effort": "high"},
        "metadata": {"user_id": "u"}}))
    .unwrap();
    let m = messages(&r);
    assert_eq!(
        m[0],
        Message::new(
            "system",
            "You are Claude Code.\n\nExtra rules.\n\nMore rules."
        )
    );
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(m[2].content, "Hello");
    assert_eq!(m[2].extra["reasoning_content"], "hm");
    let PromptSpec::Chat { tools, options, .. } = &r.spec.prompt else {
        panic!("a chat")
    };
    let tools = tools.as_ref().unwrap().as_array().unwrap();
    assert_eq!(tools.len(), 1, "the server tool is left out");
    assert!(options.is_empty(), "adaptive keeps the template's default");
    assert_eq!(r.spec.max_tokens, Some(32000));
    let on = |kind: &str| {
        let r = req(
            json!({"max_tokens": 1, "messages": hi(), "thinking": {"type": kind, "budget_tokens": 1024}}),
        );
        let PromptSpec::Chat { options, .. } = r.unwrap().spec.prompt else {
            panic!("a chat")
        };
        options.get("enable_thinking").cloned()
    };
    assert_eq!(on("enabled"), Some(json!(true)));
    assert_eq!(on("disabled"), Some(json!(false)));
}

#[test]
fn counting_needs_no_max_tokens() {
    let body = json!({"messages": hi()}).to_string();
    let d = SamplingParams::default();
    assert!(parse(body.as_bytes(), &d, Purpose::Reply).is_err());
    let r = parse(body.as_bytes(), &d, Purpose::Count).unwrap();
    assert!(r.spec.count_only);
    assert!(
        !req(json!({"max_tokens": 1, "messages": hi()}))
            .unwrap()
            .spec
            .count_only
    );
}
