use serde_json::json;

use super::events::Streamer;
use super::*;
use crate::chat::tool_calls::CallFormat;
use crate::serve::error::ApiError;

fn head(calls: ReplySplit) -> Head {
    Head {
        id: "resp_bmoe1".into(),
        created_at: 7,
        model: "m".into(),
        instructions: None,
        max_output_tokens: Some(16),
        temperature: 0.0,
        top_p: 1.0,
        calls,
    }
}

fn hermes() -> Head {
    head(ReplySplit::new(
        CallFormat::Hermes,
        Some(json!([{"type": "function", "function": {"name": "weather"}}])),
    ))
}

fn done(finish_reason: &'static str) -> Done {
    let mut d = Done {
        finish_reason,
        stop_sequence: None,
        prompt_tokens: 9,
        completion_tokens: 4,
        figures: Default::default(),
        notes: Vec::new(),
    };
    d.figures.reused_tokens = 5;
    d
}

const CALLED: &str = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

#[test]
fn a_whole_reply_is_a_response_with_usage_and_its_ending() {
    let r = head(ReplySplit::default()).whole("Hello", &done("stop"));
    assert_eq!(
        (&r["object"], &r["status"]),
        (&json!("response"), &json!("completed"))
    );
    assert_eq!(r["incomplete_details"], Value::Null);
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(
        r["output"][0]["content"][0],
        json!({"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []})
    );
    assert_eq!(r["usage"]["input_tokens"], 9);
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 5);
    assert_eq!(
        (&r["usage"]["output_tokens"], &r["usage"]["total_tokens"]),
        (&json!(4), &json!(13))
    );
    let cut = head(ReplySplit::default()).whole("Hello", &done("length"));
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(
        cut["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
}

#[test]
fn calls_are_function_call_items() {
    let r = hermes().whole(CALLED, &done("stop"));
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["content"][0]["text"], "Let me check.");
    assert_eq!(
        (&out[1]["type"], &out[1]["name"]),
        (&json!("function_call"), &json!("weather"))
    );
    assert_eq!(
        serde_json::from_str::<Value>(out[1]["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    assert!(
        out[1]["call_id"].as_str().unwrap().starts_with("call_"),
        "{}",
        out[1]
    );
}

/// The event names of `events`, and that their numbers count up from 0.
fn names(events: &[(&'static str, Value)]) -> Vec<&'static str> {
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{name}");
        assert_eq!(data["type"], *name);
    }
    events.iter().map(|e| e.0).collect()
}

#[test]
fn a_stream_of_text_is_the_reference_sequence() {
    let mut s = Streamer::new(head(ReplySplit::default()));
    let mut all = s.opening();
    all.extend(s.push("Hel"));
    all.extend(s.push("lo"));
    all.extend(s.closing(&done("stop")));
    assert_eq!(
        names(&all),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(all[6].1["text"], "Hello");
    let last = &all[9].1["response"];
    assert_eq!(last["id"], all[0].1["response"]["id"]);
    assert_eq!(last["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(last["output"][0]["id"], all[2].1["item"]["id"]);
    assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], 5);
}

#[test]
fn a_streamed_call_is_held_back_and_sent_as_a_function_call_item() {
    let mut s = Streamer::new(hermes());
    let mut all = s.opening();
    let (a, b) = CALLED.split_at(20);
    all.extend(s.push(a));
    all.extend(s.push(b));
    all.extend(s.closing(&done("stop")));
    let n = names(&all);
    assert_eq!(
        n[n.len() - 8..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let shown: String = all
        .iter()
        .filter(|e| e.0 == "response.output_text.delta")
        .map(|e| e.1["delta"].as_str().unwrap())
        .collect();
    assert_eq!(shown, "Let me check.", "the call never streams as text");
    let end = &all.last().unwrap().1["response"]["output"];
    assert_eq!(end[1]["type"], "function_call");
    assert_eq!(end[1]["status"], "completed");
}

/// Under a call grammar the item is added as soon as the call's name is
/// written and its arguments stream as deltas, whose join is the done
/// item's arguments; text the model writes after the call stays after it.
#[test]
fn a_held_call_is_added_at_its_name_and_its_arguments_stream() {
    let mut s = Streamer::new(head(hermes().calls.held(true)));
    let mut all = s.opening();
    let reply = format!("{CALLED}\nDone.");
    let at_name = reply.find("\"arguments\"").unwrap();
    for (i, c) in reply.char_indices() {
        all.extend(s.push(&c.to_string()));
        if i == at_name {
            assert!(names(&all).contains(&"response.output_item.added"));
        }
    }
    all.extend(s.closing(&done("stop")));
    let deltas: Vec<&str> = all
        .iter()
        .filter(|e| e.0 == "response.function_call_arguments.delta")
        .map(|e| e.1["delta"].as_str().unwrap())
        .collect();
    assert!(deltas.len() > 2, "{deltas:?}");
    let done_args = all
        .iter()
        .find(|e| e.0 == "response.function_call_arguments.done")
        .map(|e| e.1["arguments"].clone());
    assert_eq!(done_args, Some(json!("{\"city\":\"Paris\"}")));
    assert_eq!(deltas.concat(), "{\"city\":\"Paris\"}");
    let end = &all.last().unwrap().1["response"]["output"];
    assert_eq!(end[1]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(end[1]["status"], "completed");
}

#[test]
fn an_empty_reply_still_has_a_message_and_a_cut_one_ends_incomplete() {
    let mut s = Streamer::new(head(ReplySplit::default()));
    let mut all = s.opening();
    all.extend(s.closing(&done("length")));
    assert_eq!(names(&all).last(), Some(&"response.incomplete"));
    assert_eq!(
        all.last().unwrap().1["response"]["output"][0]["type"],
        "message"
    );
    assert!(s.push("late").is_empty(), "nothing after the end");
}

#[test]
fn a_failure_is_an_error_event_then_response_failed() {
    let mut s = Streamer::new(head(ReplySplit::default()));
    let mut all = s.opening();
    all.extend(s.failed(&ApiError::invalid(Some("input"), "too long")));
    assert_eq!(names(&all)[2..], ["error", "response.failed"]);
    assert_eq!(all[2].1["message"], "too long");
    assert_eq!(all[3].1["response"]["status"], "failed");
    assert_eq!(all[3].1["response"]["error"]["message"], "too long");
}

/// A reply of a template that opens `<think>` in the prompt: a reasoning
/// item streams first (`response.reasoning_text.delta`s), closed before the
/// message item opens; the finished response holds both, in that order.
#[test]
fn reasoning_streams_as_a_reasoning_item_before_the_message() {
    let h = head(ReplySplit::new_thinking(CallFormat::None, None, true));
    let mut s = Streamer::new(h);
    let mut events = s.opening();
    for piece in "I should greet.\n</think>\n\nHello".as_bytes().chunks(4) {
        events.extend(s.push(std::str::from_utf8(piece).expect("ASCII")));
    }
    events.extend(s.closing(&done("stop")));
    let names: Vec<&str> = events.iter().map(|e| e.0).collect();
    let first = |n: &str| names.iter().position(|x| *x == n).expect(n);
    let last = |n: &str| names.iter().rposition(|x| *x == n).expect(n);
    assert!(last("response.reasoning_text.delta") < first("response.reasoning_text.done"));
    assert!(first("response.reasoning_text.done") < first("response.output_text.delta"));
    let reasoning: String = events
        .iter()
        .filter(|e| e.0 == "response.reasoning_text.delta")
        .filter_map(|e| e.1["delta"].as_str())
        .collect();
    assert_eq!(reasoning, "I should greet.");
    let added = &events[first("response.output_item.added")].1;
    assert_eq!(
        (&added["item"]["type"], &added["output_index"]),
        (&json!("reasoning"), &json!(0))
    );
    let r = &events.last().expect("completed").1["response"];
    assert_eq!(r["output"][0]["content"][0]["text"], "I should greet.");
    assert_eq!(r["output"][1]["content"][0]["text"], "Hello");
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|e| e.1["sequence_number"].as_u64())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}
