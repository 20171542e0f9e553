//! OpenAI's shapes of a reply's calls and reasoning, whole and streamed.

use serde_json::{json, Value};

use super::*;
use crate::chat::tool_calls::CallFormat;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}}])
}

/// GLM's values are typed by the tool's schema: a string parameter
/// stays text even when it reads as a number.
#[test]
fn a_glm_reply_becomes_openai_tool_calls() {
    let split = ReplySplit::new(CallFormat::Glm, Some(tools()));
    let reply = "Looking.\n<tool_call>lookup\n<arg_key>code</arg_key>\n<arg_value>0042</arg_value>\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    let c = chat_choice(&split, reply, "stop");
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["content"], "Looking.");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("text")).expect("JSON");
    assert_eq!(args, json!({"code": "0042", "n": 3}));
}

/// Streamed, Kimi's section is held back and its calls come as indexed
/// deltas (index, id and name first, then the arguments) once the
/// section closes, before the reply ends; a broken section is text with
/// the stop reason.
#[test]
fn a_kimi_stream_sends_indexed_call_deltas_once_the_section_closes() {
    let split = ReplySplit::new(CallFormat::Kimi, Some(tools()));
    let call = |n: u32| {
        format!("<|tool_call_begin|>functions.lookup:{n}<|tool_call_argument_begin|>{{\"n\": {n}}}<|tool_call_end|>")
    };
    let reply = format!(
        "Two.<|tool_calls_section_begin|>{}{}<|tool_calls_section_end|>",
        call(0),
        call(1)
    );
    let mut s = split.stream();
    let (mut shown, mut deltas) = (String::new(), Vec::new());
    for piece in reply.as_bytes().chunks(5) {
        let p = s.push(std::str::from_utf8(piece).expect("ASCII"));
        shown.push_str(&p.content);
        deltas.extend(call_deltas(&p));
    }
    assert_eq!(deltas.len(), 4, "both calls before the end");
    let (rest, finish) = split.end(s, "stop");
    assert_eq!(shown + &rest.content, "Two.");
    assert!(rest.parts.is_empty());
    assert_eq!(finish, "tool_calls");
    let first = &deltas[2]["tool_calls"][0];
    assert_eq!(
        (&first["index"], &first["function"]["name"]),
        (&json!(1), &json!("lookup"))
    );
    assert!(first["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    assert_eq!(first["function"]["arguments"], "");
    assert_eq!(
        deltas[3]["tool_calls"][0]["function"]["arguments"],
        "{\"n\":1}"
    );

    let broken = "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0";
    let mut s = split.stream();
    let shown = s.push(broken).content;
    let (rest, finish) = split.end(s, "length");
    assert_eq!(shown + &rest.content, broken);
    assert!(rest.parts.is_empty());
    assert_eq!(finish, "length");
}

/// A whole reply of a thinking template: the block is
/// `reasoning_content`, out of the content; streamed, the same split
/// comes as reasoning first, and a call after the block is a call.
#[test]
fn a_thinking_reply_has_its_reasoning_apart_whole_and_streamed() {
    let split = ReplySplit::new(CallFormat::Hermes, Some(tools())).thinking(true, false);
    let reply = "<think>\nNeed a lookup.\n</think>\n\nOne moment.\n<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"n\": 1}}\n</tool_call>";
    let c = chat_choice(&split, reply, "stop");
    assert_eq!(c["message"]["reasoning_content"], "Need a lookup.");
    assert_eq!(c["message"]["content"], "One moment.");
    assert_eq!(c["message"]["tool_calls"][0]["function"]["name"], "lookup");
    let mut s = split.stream();
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), 0);
    for piece in reply.as_bytes().chunks(3) {
        let p = s.push(std::str::from_utf8(piece).expect("ASCII"));
        assert!(p.reasoning.is_empty() || content.is_empty());
        reasoning.push_str(&p.reasoning);
        content.push_str(&p.content);
        calls += p.parts.iter().filter(|c| c.name.is_some()).count();
    }
    let (rest, finish) = split.end(s, "stop");
    assert_eq!(
        (reasoning.as_str(), content + &rest.content),
        ("Need a lookup.", "One moment.".into())
    );
    assert_eq!((calls, finish), (1, "tool_calls"));
}
