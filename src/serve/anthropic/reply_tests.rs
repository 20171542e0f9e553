//! The Anthropic reply's shapes, whole and streamed.

use super::*;

fn head() -> Head {
    Head {
        id: "msg_bmoe1".into(),
        model: "m".into(),
        prompt_tokens: 9,
        calls: ReplySplit::default(),
    }
}

fn done(finish_reason: &'static str, stop_sequence: Option<&str>) -> Done {
    Done {
        finish_reason,
        stop_sequence: stop_sequence.map(str::to_string),
        prompt_tokens: 9,
        completion_tokens: 4,
        figures: Default::default(),
        notes: Vec::new(),
    }
}

#[test]
fn cached_prompt_tokens_are_cache_reads() {
    let mut d = done("stop", None);
    d.figures.reused_tokens = 6;
    let u = &head().whole("Hi", &d)["usage"];
    assert_eq!(
        (&u["input_tokens"], &u["cache_read_input_tokens"]),
        (&json!(3), &json!(6))
    );
}

#[test]
fn a_whole_reply_is_an_anthropic_message() {
    let m = head().whole("Hello", &done("length", None));
    assert_eq!(
        m,
        json!({"id": "msg_bmoe1", "type": "message", "role": "assistant", "model": "m",
               "content": [{"type": "text", "text": "Hello"}],
               "stop_reason": "max_tokens", "stop_sequence": null,
               "usage": {"input_tokens": 9, "output_tokens": 4,
                         "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})
    );
    let stopped = head().whole("Hi", &done("stop", Some("END")));
    assert_eq!(
        (&stopped["stop_reason"], &stopped["stop_sequence"]),
        (&json!("stop_sequence"), &json!("END"))
    );
    assert_eq!(
        head().whole("", &done("stop", None))["stop_reason"],
        "end_turn"
    );
}

#[test]
fn a_stream_opens_with_the_message_and_closes_with_the_stop_reason() {
    let h = head();
    let names: Vec<&str> = h.opening().iter().map(|e| e.0).collect();
    assert_eq!(names, ["message_start", "ping"]);
    let start = &h.opening()[0].1["message"];
    assert_eq!(
        (&start["content"], &start["stop_reason"]),
        (&json!([]), &Value::Null)
    );
    assert_eq!(start["usage"]["input_tokens"], 9);
    let closing = Streamer::new(h).closing(&done("stop", None));
    let names: Vec<&str> = closing.iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        [
            "content_block_start",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "an empty reply still has its text block"
    );
    assert_eq!(
        closing[2].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
               "usage": {"input_tokens": 9, "output_tokens": 4,
                         "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})
    );
}

/// A recorded Qwen3-style reply with one call, and one whose call is not JSON.
const CALLED: &str = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const MALFORMED: &str =
    "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {city}\n</tool_call>";

fn hermes() -> Head {
    Head {
        calls: ReplySplit::new(
            crate::chat::tool_calls::CallFormat::Hermes,
            Some(json!([{"type": "function", "function": {"name": "weather"}}])),
        ),
        ..head()
    }
}

#[test]
fn calls_become_tool_use_blocks_and_malformed_ones_stay_text() {
    let m = hermes().whole(CALLED, &done("stop", None));
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(
        m["content"][0],
        json!({"type": "text", "text": "Let me check."})
    );
    let call = &m["content"][1];
    assert_eq!(
        (&call["type"], &call["name"]),
        (&json!("tool_use"), &json!("weather"))
    );
    assert_eq!(call["input"], json!({"city": "Paris"}));
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    let m = hermes().whole(MALFORMED, &done("stop", None));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["content"], json!([{"type": "text", "text": MALFORMED}]));
    let plain = head().whole(CALLED, &done("stop", None));
    assert_eq!(
        plain["content"][0]["text"], CALLED,
        "no tools offered: text"
    );
}

/// The text deltas among `events`, joined.
fn texts(events: &[(&str, Value)]) -> String {
    joined(events, "text")
}

/// The deltas' `field` among `events` (`text`, `thinking`, `partial_json`), joined.
fn joined(events: &[(&str, Value)], field: &str) -> String {
    events
        .iter()
        .filter_map(|e| e.1["delta"][field].as_str())
        .collect()
}

/// The call goes out as a `tool_use` block as soon as its closing tag
/// comes, after the text block closes (the block ends with the message);
/// its text never streams as text.
#[test]
fn a_streamed_call_is_held_back_and_sent_as_a_tool_use_block() {
    let mut s = Streamer::new(hermes());
    let (head_text, tail) = CALLED.split_at(20);
    let mut events = s.push(head_text);
    assert_eq!(texts(&events), "Let me check.");
    let at_call = events.len();
    events.extend(s.push(tail));
    assert_eq!(texts(&events), "Let me check.", "the call is not text");
    let closing = s.closing(&done("stop", None));
    let names: Vec<&str> = events[at_call..].iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        [
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
        ]
    );
    let start = &events[at_call + 1].1;
    assert_eq!(
        (&start["content_block"]["name"], &start["index"]),
        (&json!("weather"), &json!(1))
    );
    assert_eq!(start["content_block"]["input"], json!({}));
    assert_eq!(
        events[at_call + 2].1["delta"],
        json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
    );
    let names: Vec<&str> = closing.iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(closing[1].1["delta"]["stop_reason"], "tool_use");
}

/// Under a call grammar the `tool_use` block opens as soon as the call's
/// name is written and its input streams as it is written: the deltas
/// joined are the whole call's input.
#[test]
fn a_held_call_streams_its_input_as_it_is_written() {
    let mut s = Streamer::new(Head {
        calls: hermes().calls.held(true),
        ..head()
    });
    let mut events = Vec::new();
    let at_name = CALLED.find("\"arguments\"").unwrap();
    for (i, c) in CALLED.char_indices() {
        events.extend(s.push(&c.to_string()));
        if i == at_name {
            let started = events
                .iter()
                .find(|e| e.0 == "content_block_start" && e.1["index"] == 1);
            assert_eq!(
                started.unwrap().1["content_block"]["name"],
                "weather",
                "{events:?}"
            );
        }
    }
    events.extend(s.closing(&done("stop", None)));
    assert_eq!(joined(&events, "partial_json"), "{\"city\":\"Paris\"}");
    let pieces = events
        .iter()
        .filter(|e| e.1["delta"]["type"] == "input_json_delta");
    assert!(pieces.count() > 2, "{events:?}");
    assert_eq!(texts(&events), "Let me check.");
}

/// A reply that starts inside `<think>` (the prompt opened it).
const THOUGHT: &str = "The user greets me.\nI greet back.\n</think>\n\nHello there";

fn thinker() -> Head {
    Head {
        calls: ReplySplit::new_thinking(crate::chat::tool_calls::CallFormat::None, None, true),
        ..head()
    }
}

/// Reasoning streams as `thinking_delta`s in a thinking block (index 0),
/// closed before the text block (index 1) opens; whole, the same split.
#[test]
fn reasoning_streams_in_a_thinking_block_before_the_text() {
    let mut s = Streamer::new(thinker());
    let mut events = Vec::new();
    for piece in THOUGHT.as_bytes().chunks(3) {
        events.extend(s.push(std::str::from_utf8(piece).expect("ASCII")));
    }
    events.extend(s.closing(&done("stop", None)));
    assert_eq!(
        joined(&events, "thinking"),
        "The user greets me.\nI greet back."
    );
    assert_eq!(texts(&events), "Hello there");
    let kinds: Vec<(&str, &Value)> = events
        .iter()
        .filter(|e| e.0 != "content_block_delta")
        .map(|e| (e.0, &e.1["index"]))
        .collect();
    let (i0, i1) = (json!(0), json!(1));
    assert_eq!(
        &kinds[..4],
        [
            ("content_block_start", &i0),
            ("content_block_stop", &i0),
            ("content_block_start", &i1),
            ("content_block_stop", &i1)
        ]
    );
    let first_text = events.iter().position(|e| e.1["delta"]["text"].is_string());
    let last_thought = events
        .iter()
        .rposition(|e| e.1["delta"]["thinking"].is_string());
    assert!(last_thought < first_text, "{events:?}");
    let m = thinker().whole(THOUGHT, &done("stop", None));
    assert_eq!(
        m["content"],
        json!([{"type": "thinking", "thinking": "The user greets me.\nI greet back.", "signature": ""},
               {"type": "text", "text": "Hello there"}])
    );
}
