//! The chat messages, tools and tool_choice read through a whole chat body.

use super::super::request::{parse, ChatRequest};
use crate::serve::error::ApiError;
use crate::serve::job::{JobSpec, PromptSpec};
use bmoe_decode::sampling::SamplingParams;
use serde_json::{json, Value};

fn chat(body: Value) -> Result<JobSpec, ApiError> {
    parse::<ChatRequest>(body.to_string().as_bytes())?.into_spec(&SamplingParams::default())
}

fn tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
}

#[test]
fn tools_and_tool_turns_reach_the_template_the_hf_way() {
    let s = chat(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": [{"type": "text", "text": "18C"}]},
        {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
            "function": {"name": "get_weather", "arguments": "not json"}}]}],
        "tools": [tool()], "tool_choice": "auto"}))
    .unwrap();
    let PromptSpec::Chat {
        messages, tools, ..
    } = s.prompt
    else {
        panic!("chat")
    };
    assert_eq!(tools, Some(json!([tool()])));
    assert_eq!(messages[1].content, "");
    let call = &messages[1].extra["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], json!({"city": "Paris"}));
    assert_eq!(messages[2].extra["tool_call_id"], "call_1");
    assert_eq!(messages[2].extra["name"], "get_weather");
    assert_eq!(messages[2].content, "18C");
    assert_eq!(
        messages[3].extra["tool_calls"][0]["function"]["arguments"],
        "not json"
    );
}

#[test]
fn tool_choice_none_renders_without_tools_and_a_named_one_must_exist() {
    let m = json!([{"role": "user", "content": "hi"}]);
    let tools_of = |choice: Value| match chat(
        json!({"messages": m, "tools": [tool()], "tool_choice": choice}),
    ) {
        Ok(JobSpec {
            prompt: PromptSpec::Chat { tools, .. },
            ..
        }) => Ok(tools.is_some()),
        Ok(_) => panic!("chat"),
        Err(e) => Err(e.param().map(str::to_string)),
    };
    assert_eq!(tools_of(json!("none")), Ok(false));
    assert_eq!(tools_of(json!("required")), Ok(true));
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    assert_eq!(tools_of(named), Ok(true));
    let unknown = json!({"type": "function", "function": {"name": "nope"}});
    assert_eq!(tools_of(unknown), Err(Some("tool_choice".to_string())));
    assert_eq!(
        tools_of(json!("sometimes")),
        Err(Some("tool_choice".to_string()))
    );
    // Issue 64, finding 9: "required" with no tools is a 400 (OpenAI's).
    let required = chat(json!({"messages": m, "tool_choice": "required"}));
    assert_eq!(
        required
            .map(drop)
            .map_err(|e| e.param().map(str::to_string)),
        Err(Some("tool_choice".to_string()))
    );
    assert_eq!(tools_of(json!(3)), Err(Some("tool_choice".to_string())));
}

#[test]
fn bad_shapes_name_the_field_in_plain_words() {
    let m = json!([{"role": "user", "content": "hi"}]);
    let err = |extra: Value| {
        let mut body = json!({"messages": m});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        chat(body).unwrap_err()
    };
    for bad_tools in [
        json!("get_weather"),
        json!([{"type": "function"}]),
        json!([{"type": "retrieval", "function": {"name": "f"}}]),
        json!([{"type": "function", "function": {"name": ""}}]),
        json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
    ] {
        let e = err(json!({"tools": bad_tools}));
        assert_eq!(e.param(), Some("tools"), "{}", e.message);
        assert!(e.message.starts_with("tools"), "{}", e.message);
    }
    for (bad_tools, says) in [
        (
            json!([{"type": "function", "function": {"name": ""}}]),
            "tools[0].function.name is empty: a tool name is 1 to 64 letters, digits, _ or -",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
            "tools[0].function.parameters must be a JSON Schema object",
        ),
        (
            json!([tool(), {"type": "function", "function": {"name": "<tool_call>"}}]),
            "tools[1].function.name \"<tool_call>\" holds '<'",
        ),
        (
            json!([tool(), tool()]),
            "tools[1].function.name \"get_weather\" is also tools[0].function.name",
        ),
    ] {
        let e = err(json!({"tools": bad_tools}));
        assert!(e.message.starts_with(says), "{}", e.message);
    }
    for bad_messages in [
        json!([{"role": "assistant", "tool_calls": {"id": 1}}]),
        json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
        json!([{"role": "tool", "tool_call_id": 7, "content": "x"}]),
        json!([{"role": "user", "content": 5}]),
        json!([{"role": "user", "content": [{"type": "image_url"}]}]),
    ] {
        let e = err(json!({"messages": bad_messages}));
        assert_eq!(e.param(), Some("messages"), "{}", e.message);
        assert!(e.message.starts_with("messages[0]"), "{}", e.message);
        assert!(
            !e.message.contains("enum") && !e.message.contains("struct"),
            "{}",
            e.message
        );
    }
}
