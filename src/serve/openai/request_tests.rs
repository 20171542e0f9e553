//! Tests of `request` (beside it to keep that file on its one topic).
use axum::http::StatusCode;

use super::*;
use crate::serve::job::{ANONYMOUS, REQUESTER_MAX_CHARS};

fn chat(json: &str) -> Result<JobSpec, ApiError> {
    parse::<ChatRequest>(json.as_bytes())?.into_spec(&SamplingParams::default())
}

#[test]
fn a_plain_chat_request_is_greedy_and_unlimited() {
    let s = chat(r#"{"model":"x","messages":[{"role":"user","content":"hi"}],"user":" ann "}"#)
        .unwrap();
    assert_eq!(s.requester, "ann", "the user field names the requester");
    assert!(s.sampling.is_greedy());
    assert_eq!(s.max_tokens, None);
    assert!(!s.stream);
    let PromptSpec::Chat { messages, .. } = s.prompt else {
        panic!("chat")
    };
    assert_eq!(messages[0].content, "hi");
    let anon = chat(r#"{"messages":[{"role":"user","content":"hi"}],"user":""}"#).unwrap();
    assert_eq!(anon.requester, ANONYMOUS);
    let long = format!(
        r#"{{"messages":[{{"role":"user","content":"hi"}}],"user":"{}"}}"#,
        "é".repeat(100)
    );
    assert_eq!(
        chat(&long).unwrap().requester.chars().count(),
        REQUESTER_MAX_CHARS
    );
}

#[test]
fn settings_stop_strings_and_text_parts_are_taken() {
    let s = chat(
        r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
            "temperature":0.7,"seed":42,"stop":"END","max_tokens":5,"stream":true,
            "stream_options":{"include_usage":true}}"#,
    )
    .unwrap();
    assert_eq!((s.sampling.temperature, s.sampling.seed), (0.7, 42));
    assert_eq!(s.stop, vec!["END".to_string()]);
    assert_eq!(s.max_tokens, Some(5));
    assert!(s.stream && s.include_usage);
    let PromptSpec::Chat { messages, .. } = s.prompt else {
        panic!("chat")
    };
    assert_eq!(
        (messages[0].role.as_str(), messages[0].content.as_str()),
        ("system", "ab")
    );
}

#[test]
fn bad_requests_name_the_field() {
    let param = |json: &str| chat(json).unwrap_err().param().map(str::to_string);
    assert_eq!(
        chat("{not json").unwrap_err().status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(param(r#"{"messages":[]}"#), Some("messages".into()));
    assert_eq!(
        param(r#"{"messages":[{"role":"robot","content":"x"}]}"#),
        Some("messages".into())
    );
    let m = r#""messages":[{"role":"user","content":"x"}]"#;
    assert_eq!(
        param(&format!("{{{m},\"temperature\":-1}}")),
        Some("temperature".into())
    );
    assert_eq!(
        param(&format!("{{{m},\"max_tokens\":0}}")),
        Some("max_tokens".into())
    );
    assert_eq!(param(&format!("{{{m},\"n\":2}}")), Some("n".into()));
    assert_eq!(param(&format!("{{{m},\"seed\":-3}}")), Some("seed".into()));
    assert_eq!(param(&format!("{{{m},\"top_p\":0}}")), Some("top_p".into()));
    let e = chat(&format!("{{{m},\"messages\":3}}")).unwrap_err();
    assert!(e.message.starts_with("invalid"), "{}", e.message);
}

#[test]
fn completions_take_one_prompt() {
    let d = SamplingParams::default();
    let one = parse::<CompletionRequest>(br#"{"prompt":["a"]}"#)
        .unwrap()
        .into_spec(&d)
        .unwrap();
    assert!(matches!(one.prompt, PromptSpec::Text(ref t) if t == "a"));
    let two = parse::<CompletionRequest>(br#"{"prompt":["a","b"]}"#)
        .unwrap()
        .into_spec(&d);
    assert_eq!(two.unwrap_err().param(), Some("prompt"));
}

#[test]
fn fields_of_several_shapes_are_explained_without_rust_types() {
    for (json, param) in [
        (r#"{"prompt": 3}"#, "prompt"),
        (r#"{"prompt": "a", "stop": 3}"#, "stop"),
    ] {
        let e = parse::<CompletionRequest>(json.as_bytes()).unwrap_err();
        assert_eq!(e.param(), Some(param), "{}", e.message);
        assert!(!e.message.contains("enum"), "{}", e.message);
        assert!(
            e.message.contains(&format!("{param} must be")),
            "{}",
            e.message
        );
    }
}

#[test]
fn completion_options_this_server_has_not_are_refused_unless_default() {
    let spec = |extra: &str| {
        parse::<CompletionRequest>(format!(r#"{{"prompt": "a"{extra}}}"#).as_bytes())
            .and_then(|r| r.into_spec(&SamplingParams::default()))
    };
    for (extra, param) in [
        (r#", "echo": true"#, "echo"),
        (r#", "logprobs": 2"#, "logprobs"),
        (r#", "logprobs": 0"#, "logprobs"),
        (r#", "suffix": "}""#, "suffix"),
        (r#", "best_of": 3"#, "best_of"),
    ] {
        let e = spec(extra).unwrap_err();
        assert_eq!(e.param(), Some(param), "{extra}: {}", e.message);
        assert!(e.message.starts_with(param), "{}", e.message);
    }
    for defaults in [
        r#", "echo": false, "logprobs": null, "suffix": null, "best_of": 1"#,
        r#", "echo": null, "suffix": "", "best_of": null"#,
    ] {
        assert!(spec(defaults).is_ok(), "{defaults}");
    }
}

#[test]
fn type_errors_speak_json_not_rust() {
    for (body, param, words) in [
        (
            r#"[]"#,
            None,
            "the body must be a JSON object, not an array",
        ),
        (
            r#"{"prompt": "a", "max_tokens": "5"}"#,
            Some("max_tokens"),
            "max_tokens: invalid type: string \"5\", expected an integer",
        ),
        (
            r#"{"prompt": "a", "temperature": [1]}"#,
            Some("temperature"),
            "temperature: invalid type: array, expected a number",
        ),
        (
            r#"{"prompt": "a", "stream_options": 1}"#,
            Some("stream_options"),
            "stream_options: invalid type: integer `1`, expected an object",
        ),
    ] {
        let e = parse::<CompletionRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(e.param(), param, "{}", e.message);
        assert!(e.message.ends_with(words), "{body}: {}", e.message);
    }
    let e = chat(r#"{"messages": [{"role": "user", "content": "x"}, 3]}"#).unwrap_err();
    assert_eq!(e.param(), Some("messages"));
    assert!(
        e.message
            .ends_with("messages[1]: invalid type: integer `3`, expected an object"),
        "{}",
        e.message
    );
}

/// `reasoning_effort: "none"` is the template's switch off
/// (`enable_thinking` false) unless `chat_template_kwargs` says otherwise;
/// another effort reaches the template as `reasoning_effort`.
#[test]
fn reasoning_effort_none_turns_the_templates_thinking_off() {
    let options = |body: &str| match chat(body).expect("a valid request").prompt {
        PromptSpec::Chat { options, .. } => options,
        PromptSpec::Text(_) => panic!("a chat"),
    };
    let hi = r#""messages": [{"role": "user", "content": "hi"}]"#;
    let o = options(&format!(r#"{{{hi}, "reasoning_effort": "none"}}"#));
    assert_eq!(
        o.get("enable_thinking"),
        Some(&serde_json::Value::Bool(false))
    );
    let o = options(&format!(
        r#"{{{hi}, "reasoning_effort": "none", "chat_template_kwargs": {{"enable_thinking": true}}}}"#
    ));
    assert_eq!(
        o.get("enable_thinking"),
        Some(&serde_json::Value::Bool(true))
    );
    let o = options(&format!(r#"{{{hi}, "reasoning_effort": "low"}}"#));
    assert_eq!(
        o.get("reasoning_effort"),
        Some(&serde_json::Value::from("low"))
    );
    assert!(o.get("enable_thinking").is_none());
}

/// A chat body's `tool_choice` and `response_format` reach the job as
/// its constraint; a refused schema is a 400 when the body is read.
#[test]
fn a_chat_body_carries_its_constraint() {
    use crate::chat::tool_grammar::ToolChoice;
    use serde_json::{json, Value};
    let spec = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        parse::<ChatRequest>(b.to_string().as_bytes())?.into_spec(&SamplingParams::default())
    };
    let of = |extra: Value| spec(extra).map(|s| s.constraint);
    assert_eq!(of(json!({})), Ok(Constraint::Calls(ToolChoice::Auto)));
    assert_eq!(of(json!({"tool_choice": "none"})), Ok(Constraint::None));
    assert_eq!(
        of(json!({"tool_choice": "required"})),
        Ok(Constraint::Calls(ToolChoice::Required))
    );
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "f"}}});
    assert_eq!(
        of(named),
        Ok(Constraint::Calls(ToolChoice::Named("f".into())))
    );
    let json_object = of(json!({"response_format": {"type": "json_object"}}));
    assert!(
        matches!(json_object, Ok(Constraint::Json { .. })),
        "{json_object:?}"
    );
    let refused = json!({"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"$ref": "#/$defs/nowhere"}}}});
    let e = spec(refused).unwrap_err();
    assert_eq!(e.param(), Some("response_format"));
    assert!(e.message.contains("#/$defs/nowhere"), "{}", e.message);
}
