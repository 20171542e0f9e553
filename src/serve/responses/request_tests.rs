use axum::http::StatusCode;
use serde_json::json;

use super::*;

fn req(v: Value) -> Result<ResponsesRequest, ApiError> {
    parse(v.to_string().as_bytes(), &SamplingParams::default())
}

fn chat(r: &ResponsesRequest) -> (&[Message], Option<&Value>) {
    match &r.spec.prompt {
        PromptSpec::Chat {
            messages, tools, ..
        } => (messages, tools.as_ref()),
        PromptSpec::Text(_) => panic!("a chat"),
    }
}

fn weather() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true})
}

#[test]
fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
    let r = req(
        json!({"model": "m", "instructions": "Be brief.", "input": "hi",
        "max_output_tokens": 16, "temperature": 0.5, "top_p": 0.9, "store": false, "stream": true}),
    )
    .unwrap();
    let (m, tools) = chat(&r);
    assert_eq!(
        m,
        [
            Message::new("system", "Be brief."),
            Message::new("user", "hi")
        ]
    );
    assert!(tools.is_none());
    assert_eq!(r.spec.max_tokens, Some(16));
    assert_eq!(
        (r.spec.sampling.temperature, r.spec.sampling.top_p),
        (0.5, 0.9)
    );
    assert!(r.spec.stream);
    assert_eq!(r.instructions.as_deref(), Some("Be brief."));
}

/// Codex's shape: developer messages, input_text parts, a reasoning item,
/// a call and its output, function tools beside hosted ones.
#[test]
fn items_become_the_conversation_the_template_reads() {
    let r = req(json!({"input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}], "encrypted_content": null},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "oops"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 18C."}]},
            {"role": "system", "content": "late rules"},
            {"role": "user", "content": "thanks"}],
        "tools": [weather(), {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}],
        "tool_choice": "auto", "parallel_tool_calls": false, "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "text": {"verbosity": "low"}}))
    .unwrap();
    let (m, tools) = chat(&r);
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "user"
        ]
    );
    assert_eq!(m[0].content, "rules\n\nlate rules");
    assert_eq!(m[1].content, "Weather in Paris?");
    let calls = &m[2].extra["tool_calls"];
    assert_eq!(calls[0]["function"]["arguments"], json!({"city": "Paris"}));
    assert_eq!(calls[1]["function"]["arguments"], "oops");
    assert_eq!(m[2].extra["reasoning_content"], "look it up");
    assert_eq!(
        (m[3].content.as_str(), &m[3].extra["tool_call_id"]),
        ("18C", &json!("call_1"))
    );
    assert_eq!(m[4].content, "?");
    assert_eq!(m[5].content, "It is 18C.");
    let tools = tools.unwrap().as_array().unwrap();
    assert_eq!(tools.len(), 1, "only function tools are offered");
    assert_eq!(tools[0]["function"]["name"], "get_weather");
    assert_eq!(tools[0]["function"]["parameters"]["type"], "object");
}

#[test]
fn tool_choice_none_offers_no_tools_and_a_named_one_must_exist() {
    let offered = |choice: Value| {
        req(json!({"input": "hi", "tools": [weather()], "tool_choice": choice}))
            .map(|r| chat(&r).1.is_some())
            .map_err(|e| e.param().map(str::to_string))
    };
    assert_eq!(offered(json!("none")), Ok(false));
    assert_eq!(offered(json!("required")), Ok(true));
    assert_eq!(
        offered(json!({"type": "function", "name": "get_weather"})),
        Ok(true)
    );
    assert_eq!(offered(json!({"type": "web_search"})), Ok(true));
    assert_eq!(
        offered(json!({"type": "function", "name": "nope"})),
        Err(Some("tool_choice".to_string()))
    );
    assert_eq!(
        offered(json!("sometimes")),
        Err(Some("tool_choice".to_string()))
    );
    assert_eq!(offered(json!(3)), Err(Some("tool_choice".to_string())));
}

#[test]
fn malformed_bodies_are_400s_naming_the_field() {
    for (body, param, says) in [
        (json!({}), "input", "input is required"),
        (
            json!({"input": 3}),
            "input",
            "input must be a string or a list of items",
        ),
        (json!({"input": [3]}), "input", "input[0] must be an object"),
        (
            json!({"input": [{"content": "x"}]}),
            "input",
            "input[0].type is required",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input",
            "input[0].type \"item_reference\"",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input",
            "input[0].role \"robot\"",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            "input",
            "input[0].content[0]: parts of type \"input_image\"",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f"}]}),
            "input",
            "input[0].call_id is required",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}),
            "input",
            "input[0].output must be",
        ),
        (
            json!({"input": [{"role": "system", "content": "x"}]}),
            "input",
            "input holds no user message",
        ),
        (
            json!({"input": "hi", "instructions": ["x"]}),
            "instructions",
            "instructions must be a string",
        ),
        (
            json!({"input": "hi", "tools": {}}),
            "tools",
            "tools must be a list",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "function"}]}),
            "tools",
            "tools[0].name",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": "x"}]}),
            "tools",
            "tools[0].parameters must be",
        ),
        (
            json!({"input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
            "max_output_tokens = 0",
        ),
        (
            json!({"input": "hi", "max_output_tokens": "9"}),
            "max_output_tokens",
            "max_output_tokens must be a whole number",
        ),
        (
            json!({"input": "hi", "temperature": "hot"}),
            "temperature",
            "temperature must be a number",
        ),
        (
            json!({"input": "hi", "temperature": -1}),
            "temperature",
            "temperature",
        ),
        (
            json!({"input": "hi", "stream": "yes"}),
            "stream",
            "stream must be true or false",
        ),
        (
            json!({"input": "hi", "store": 1}),
            "store",
            "store must be true or false",
        ),
        (
            json!({"input": "hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
            "previous_response_id: this server keeps no responses",
        ),
    ] {
        let e = req(body.clone()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(e.param(), Some(param), "{body}: {}", e.message);
        assert!(e.message.starts_with(says), "{body}: {}", e.message);
    }
    let e = parse(b"{not json", &SamplingParams::default()).unwrap_err();
    assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
    let e = parse(b"[1]", &SamplingParams::default()).unwrap_err();
    assert!(e.message.contains("JSON object"), "{}", e.message);
}
