//! The worker's events as Anthropic replies: one `message` object once the
//! generation ends, or its server-sent events (`message_start`, a text
//! block's `content_block_start`, `ping`, one `content_block_delta` per piece
//! of text, `content_block_stop`, `message_delta` with the stop reason and
//! the usage, `message_stop`).

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::request::MessagesRequest;
use crate::chat::tool_calls::{CallStream, Parsed};
use crate::serve::api::ApiError;
use crate::serve::routes;
use crate::serve::tools::ReplySplit;
use crate::serve::worker::{App, Done, Event};

/// What every part of one reply carries.
struct Head {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// How the reply's text splits into text and tool calls (no split when
    /// the request offered no tools or the template's calls are not parsed).
    calls: ReplySplit,
}

/// Queue the request's job and answer: an error before any text, else the
/// stream or the whole message.
pub(super) async fn run(app: &App, req: MessagesRequest) -> Result<Response, ApiError> {
    let stream = req.spec.stream;
    let calls = ReplySplit::of(&req.spec, app.call_format);
    let (rx, started) = routes::start_job(app, req.spec).await?;
    let prompt_tokens = started.prompt_tokens;
    let head = Head {
        id: routes::reply_id(app, "msg_"),
        model: app.model_id.clone(),
        prompt_tokens,
        calls,
    };
    let mut response = if stream {
        sse(head, rx).into_response()
    } else {
        whole(head, rx).await?
    };
    // A max_tokens over what the context leaves is capped, not refused: the
    // reply's limit is said here.
    response.headers_mut().insert(
        MAX_TOKENS_HEADER,
        axum::http::HeaderValue::from(started.max_tokens),
    );
    Ok(response)
}

/// The header that says the most tokens the reply may have (the request's
/// `max_tokens`, capped to what the context leaves after the prompt).
pub(crate) const MAX_TOKENS_HEADER: &str = "x-bmoe-max-tokens";

/// Parsed calls as Anthropic `tool_use` blocks (`{"type": "tool_use", "id":
/// "toolu_...", "name": ..., "input": {...}}`); arguments that are not a JSON
/// object are passed as `{"arguments": TEXT}`.
fn tool_use_blocks(p: &Parsed) -> Vec<Value> {
    p.calls
        .iter()
        .map(|c| {
            let input = match serde_json::from_str::<Value>(&c.arguments) {
                Ok(v @ Value::Object(_)) => v,
                _ => json!({"arguments": c.arguments}),
            };
            let id = c.id.replacen("call_", "toolu_", 1);
            json!({"type": "tool_use", "id": id, "name": c.name, "input": input})
        })
        .collect()
}

/// Anthropic's stop reason for how the generation ended.
fn stop_reason(d: &Done, calls_tools: bool) -> &'static str {
    if calls_tools {
        "tool_use"
    } else if d.finish_reason == "length" {
        "max_tokens"
    } else if d.stop_sequence.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    }
}

impl Head {
    /// The message object; `d` None while it has only begun (streaming).
    fn message(&self, content: Value, d: Option<(&Done, bool)>) -> Value {
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content,
            "stop_reason": d.map(|(d, calls)| stop_reason(d, calls)),
            "stop_sequence": d.and_then(|(d, _)| d.stop_sequence.clone()),
            "usage": self.usage(d.map(|(d, _)| d)),
        })
    }

    /// Anthropic's usage: once done, `input_tokens` is the part of the
    /// prompt decoded and `cache_read_input_tokens` the part found in the KV
    /// or prompt cache (their sum is the prompt); before, the whole prompt.
    fn usage(&self, d: Option<&Done>) -> Value {
        let Some(d) = d else {
            return json!({"input_tokens": self.prompt_tokens, "output_tokens": 0});
        };
        let cached = (d.figures.reused_tokens as usize).min(self.prompt_tokens);
        json!({"input_tokens": self.prompt_tokens - cached, "output_tokens": d.completion_tokens,
               "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0})
    }

    /// The whole reply: the text block, then any `tool_use` blocks.
    fn whole(&self, text: &str, d: &Done) -> Value {
        let parsed = self.calls.parse(text);
        let (text, calls) = (parsed.content.as_str(), tool_use_blocks(&parsed));
        let mut content = Vec::with_capacity(calls.len() + 1);
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        let calls_tools = !calls.is_empty();
        content.extend(calls);
        self.message(Value::Array(content), Some((d, calls_tools)))
    }

    /// The events that open a stream.
    fn opening(&self) -> Vec<(&'static str, Value)> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": self.message(json!([]), None)}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
        ]
    }

    /// The events that close a stream: the text still held back, the end of
    /// the text block, any `tool_use` blocks whole, then the stop reason and
    /// the usage.
    fn closing(&self, split: CallStream, d: &Done) -> Vec<(&'static str, Value)> {
        let (rest, parsed) = self.calls.finish(split);
        let calls = tool_use_blocks(&parsed);
        let mut out = Vec::new();
        if !rest.is_empty() {
            out.push(text_delta(&rest));
        }
        out.push(block_stop(0));
        for (i, call) in calls.iter().enumerate() {
            let mut start = call.clone();
            start["input"] = json!({});
            out.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": i + 1, "content_block": start}),
            ));
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i + 1,
                       "delta": {"type": "input_json_delta", "partial_json": call["input"].to_string()}}),
            ));
            out.push(block_stop(i + 1));
        }
        out.push((
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(d, !calls.is_empty()), "stop_sequence": d.stop_sequence},
                   "usage": self.usage(Some(d))}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }
}

fn block_stop(index: usize) -> (&'static str, Value) {
    (
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

fn text_delta(text: &str) -> (&'static str, Value) {
    (
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    )
}

/// The whole message once generation ends.
async fn whole(head: Head, rx: mpsc::Receiver<Event>) -> Result<Response, ApiError> {
    routes::whole_reply(rx, |text, d| head.whole(text, d)).await
}

/// The reply as Anthropic's server-sent events; a failure after the start
/// is an `error` event.
fn sse(
    head: Head,
    rx: mpsc::Receiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let opening = head.opening();
    // Text that could open a call is held back until it is known not to.
    let mut split = Some(head.calls.stream());
    let events = ReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Text(t) => split
                .as_mut()
                .map(|s| s.push(&t))
                .filter(|shown| !shown.is_empty())
                .map(|shown| text_delta(&shown))
                .into_iter()
                .collect(),
            // The split ends with the first Done (there is no second).
            Event::Done(d) => split
                .take()
                .map(|s| head.closing(s, &d))
                .unwrap_or_default(),
            Event::Failed(e) => vec![("error", super::error_body(&e))],
            Event::Started { .. } => Vec::new(),
        };
        stream::iter(out)
    });
    routes::named_sse(opening, events)
}

#[cfg(test)]
mod tests {
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
    fn a_stream_opens_with_the_message_and_closes_with_the_stop_reason() {
        let h = head();
        let names: Vec<&str> = h.opening().iter().map(|e| e.0).collect();
        assert_eq!(names, ["message_start", "content_block_start", "ping"]);
        let start = &h.opening()[0].1["message"];
        assert_eq!(
            (&start["content"], &start["stop_reason"]),
            (&json!([]), &Value::Null)
        );
        assert_eq!(start["usage"]["input_tokens"], 9);
        assert_eq!(
            text_delta("a").1["delta"],
            json!({"type": "text_delta", "text": "a"})
        );
        let closing = h.closing(h.calls.stream(), &done("stop", None));
        let names: Vec<&str> = closing.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(
            closing[1].1,
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

    #[test]
    fn a_streamed_call_is_held_back_and_sent_as_a_tool_use_block() {
        let h = hermes();
        let mut split = h.calls.stream();
        let (head_text, tail) = CALLED.split_at(20);
        let shown = split.push(head_text) + &split.push(tail);
        assert_eq!(
            shown, "Let me check.",
            "the call's text never streams as text"
        );
        let closing = h.closing(split, &done("stop", None));
        let names: Vec<&str> = closing.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(closing[1].1["content_block"]["name"], "weather");
        assert_eq!(
            closing[2].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
        );
        assert_eq!(closing[4].1["delta"]["stop_reason"], "tool_use");
    }
}
