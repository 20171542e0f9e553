//! The worker's events as Anthropic replies: one `message` object once the
//! generation ends, or its server-sent events (`message_start`, `ping`, then
//! each content block as its text comes: a `thinking` block of
//! `thinking_delta`s for the reasoning, a `text` block of `text_delta`s, a
//! `tool_use` block per call as soon as it is decided, each opened by
//! `content_block_start` and closed by `content_block_stop`; last
//! `message_delta` with the stop reason and the usage, `message_stop`).

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::chat::tool_calls::{CallPart, Parsed, ToolCall};
use crate::serve::answer::{named, Dialect, Out};
use crate::serve::error::{with_retry_after, ApiError};
use crate::serve::job::{Done, Started};
use crate::serve::split::{ReplySplit, ReplyStream, Shown};

/// What every part of one reply carries.
pub(crate) struct Head {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) prompt_tokens: usize,
    /// How the reply's text splits into text and tool calls (no split when
    /// the request offered no tools or the template's calls are not parsed).
    pub(crate) calls: ReplySplit,
}

/// The header that says the most tokens the reply may have (the request's
/// `max_tokens`, capped to what the context leaves after the prompt).
pub(crate) const MAX_TOKENS_HEADER: &str = "x-bmoe-max-tokens";

/// Parsed calls as Anthropic `tool_use` blocks (`{"type": "tool_use", "id":
/// "toolu_...", "name": ..., "input": {...}}`); arguments that are not a JSON
/// object are passed as `{"arguments": TEXT}`.
fn tool_use_blocks(p: &Parsed) -> Vec<Value> {
    p.calls.iter().map(tool_use).collect()
}

fn tool_use(c: &ToolCall) -> Value {
    let input = match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"arguments": c.arguments}),
    };
    let id = c.id.replacen("call_", "toolu_", 1);
    json!({"type": "tool_use", "id": id, "name": c.name, "input": input})
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

    /// The whole reply: any thinking block, the text block, then any
    /// `tool_use` blocks.
    fn whole(&self, text: &str, d: &Done) -> Value {
        let parsed = self.calls.parse(text);
        let (text, calls) = (parsed.content.as_str(), tool_use_blocks(&parsed));
        let mut content = Vec::with_capacity(calls.len() + 2);
        if let Some(r) = &parsed.reasoning {
            content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
        }
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        let calls_tools = !calls.is_empty();
        content.extend(calls);
        self.message(Value::Array(content), Some((d, calls_tools)))
    }

    /// The events that open a stream (its blocks open as their text comes).
    fn opening(&self) -> Vec<(&'static str, Value)> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": self.message(json!([]), None)}),
            ),
            ("ping", json!({"type": "ping"})),
        ]
    }
}

/// A content block's kind while it streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    Tool,
}

/// One stream's state: the split (None once ended), the open block and its
/// index.
pub(crate) struct Streamer {
    head: Head,
    split: Option<ReplyStream>,
    open: Option<Kind>,
    index: usize,
    /// A text block was opened.
    texted: bool,
}

impl Streamer {
    pub(crate) fn new(head: Head) -> Self {
        let split = Some(head.calls.stream());
        Self {
            head,
            split,
            open: None,
            index: 0,
            texted: false,
        }
    }

    /// The next piece: its reasoning as `thinking_delta`s in a thinking
    /// block, its text as `text_delta`s in a text block.
    fn push(&mut self, piece: &str) -> Vec<(&'static str, Value)> {
        match self.split.as_mut().map(|s| s.push(piece)) {
            Some(shown) => self.shown(&shown),
            None => Vec::new(),
        }
    }

    fn shown(&mut self, shown: &Shown) -> Vec<(&'static str, Value)> {
        // The rest of the call being written comes before what follows it.
        let (more, parts) = shown.continued();
        let mut out: Vec<_> = more.iter().flat_map(|p| self.tool_use(p)).collect();
        if !shown.reasoning.is_empty() {
            out.extend(self.block(Kind::Thinking));
            out.push(delta(
                self.index,
                json!({"type": "thinking_delta", "thinking": shown.reasoning}),
            ));
        }
        if !shown.content.is_empty() {
            out.extend(self.block(Kind::Text));
            out.push(delta(
                self.index,
                json!({"type": "text_delta", "text": shown.content}),
            ));
        }
        for part in parts {
            out.extend(self.tool_use(part));
        }
        out
    }

    /// A piece of a call: its first opens a `tool_use` block (id, name,
    /// empty input); its arguments go out as `input_json_delta`s. The block
    /// ends when the next one opens or the message ends.
    fn tool_use(&mut self, part: &CallPart) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if let Some(name) = &part.name {
            let id = part.id.replacen("call_", "toolu_", 1);
            let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            out.extend(self.open_block(Kind::Tool, start));
        }
        if !part.arguments.is_empty() && self.open == Some(Kind::Tool) {
            let json = json!({"type": "input_json_delta", "partial_json": part.arguments});
            out.push(delta(self.index, json));
        }
        out
    }

    /// Open a block of `kind` (closing the one open) unless it is open.
    fn block(&mut self, kind: Kind) -> Vec<(&'static str, Value)> {
        if self.open == Some(kind) {
            return Vec::new();
        }
        let block = match kind {
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Kind::Text | Kind::Tool => json!({"type": "text", "text": ""}),
        };
        self.open_block(kind, block)
    }

    /// Close the open block and open `block`, of `kind`.
    fn open_block(&mut self, kind: Kind, block: Value) -> Vec<(&'static str, Value)> {
        let mut out: Vec<_> = self.close_block().into_iter().collect();
        self.open = Some(kind);
        self.texted |= kind == Kind::Text;
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        out
    }

    fn close_block(&mut self) -> Option<(&'static str, Value)> {
        self.open.take()?;
        self.index += 1;
        Some(block_stop(self.index - 1))
    }

    /// The events that close a stream: what was still held back, the open
    /// block's end (an empty text block when the reply has neither text nor
    /// calls), any `tool_use` blocks whole, then the stop reason and the
    /// usage.
    fn closing(&mut self, d: &Done) -> Vec<(&'static str, Value)> {
        let Some(split) = self.split.take() else {
            return Vec::new();
        };
        let (rest, parsed) = self.head.calls.finish(split);
        let calls = !parsed.calls.is_empty();
        let mut out = self.shown(&rest);
        if !calls && !self.texted {
            out.extend(self.block(Kind::Text));
        }
        out.extend(self.close_block());
        out.push((
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(d, calls && !parsed.cut), "stop_sequence": d.stop_sequence},
                   "usage": self.head.usage(Some(d))}),
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

fn delta(index: usize, delta: Value) -> (&'static str, Value) {
    (
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

impl Dialect for Streamer {
    fn opening(&mut self) -> Vec<Out> {
        named(self.head.opening())
    }

    // Text that could open a call is held back until it is known not to.
    fn text(&mut self, piece: &str) -> Vec<Out> {
        named(self.push(piece))
    }

    fn closing(&mut self, done: &Done) -> Vec<Out> {
        named(Streamer::closing(self, done))
    }

    /// A failure after the start is an `error` event.
    fn failed(&mut self, e: &ApiError) -> Vec<Out> {
        vec![Out::named("error", &error_body(e))]
    }

    fn whole(&self, text: &str, done: &Done) -> Value {
        self.head.whole(text, done)
    }

    /// A max_tokens over what the context leaves is capped, not refused:
    /// the reply's limit is said in a header.
    fn headers(&self, started: &Started, headers: &mut HeaderMap) {
        headers.insert(MAX_TOKENS_HEADER, HeaderValue::from(started.max_tokens));
    }
}

/// Anthropic's name for an error of this status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type": ..., "message": ...}}`.
pub(crate) fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// The error as Anthropic answers one: its status and [`error_body`].
pub(crate) fn error_response(e: ApiError) -> Response {
    e.log();
    with_retry_after(e.status, axum::Json(error_body(&e)).into_response())
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
