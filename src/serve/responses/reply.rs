//! The worker's events as a Responses reply: one `response` object once the
//! generation ends, or its server-sent events (`response.created`,
//! `response.in_progress`, a reasoning item's `output_item.added`,
//! `reasoning_text.delta`s, `reasoning_text.done` and `output_item.done`
//! when the reply reasons, the message item's `output_item.added`,
//! `content_part.added`, `output_text.delta`s, `output_text.done`,
//! `content_part.done`, `output_item.done`, each function call's
//! `output_item.added`, `function_call_arguments.delta`/`.done`,
//! `output_item.done`, and last `response.completed`, or
//! `response.incomplete` when cut at `max_output_tokens`), each with its
//! `sequence_number`. A failure after the start is an `error` event and
//! `response.failed`.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::request::ResponsesRequest;
use crate::chat::tool_calls::{CallPart, Parsed, ToolCall};
use crate::serve::api::ApiError;
use crate::serve::routes;
use crate::serve::tools::{ReplySplit, ReplyStream, Shown};
use crate::serve::worker::{App, Done, Event};

/// What every part of one reply carries.
pub(super) struct Head {
    pub(super) id: String,
    pub(super) created_at: u64,
    pub(super) model: String,
    pub(super) instructions: Option<String>,
    pub(super) max_output_tokens: Option<i64>,
    pub(super) temperature: f32,
    pub(super) top_p: f32,
    /// How the reply's text splits into text and function calls.
    pub(super) calls: ReplySplit,
}

/// Queue the request's job and answer: an error before any text, else the
/// stream or the whole response.
pub(super) async fn run(app: &App, req: ResponsesRequest) -> Result<Response, ApiError> {
    let stream = req.spec.stream;
    let head = Head {
        id: routes::reply_id(app, "resp_"),
        created_at: crate::serve::now_s(),
        model: app.model_id.clone(),
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        temperature: req.spec.sampling.temperature,
        top_p: req.spec.sampling.top_p,
        calls: ReplySplit::of(&req.spec, app.call_format),
    };
    let (rx, started) = routes::start_job(app, req.spec).await?;
    let head = Head {
        calls: head.calls.started(app.thinks, &started),
        ..head
    };
    if stream {
        return Ok(sse(head, rx).into_response());
    }
    whole(head, rx).await
}

/// `usage`: the prompt's tokens (those reused from the KV cache as
/// `cached_tokens`) and the reply's.
fn usage(d: &Done) -> Value {
    json!({
        "input_tokens": d.prompt_tokens,
        "input_tokens_details": {"cached_tokens": d.figures.reused_tokens, "cache_write_tokens": 0},
        "output_tokens": d.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": d.prompt_tokens + d.completion_tokens,
    })
}

/// How a finished response ended: its status and `incomplete_details`.
fn ending(d: &Done) -> (&'static str, Value) {
    if d.finish_reason == "length" {
        ("incomplete", json!({"reason": "max_output_tokens"}))
    } else {
        ("completed", Value::Null)
    }
}

impl Head {
    /// The response object in `status`, with `output`, and, once done, its
    /// usage and how it ended.
    fn response(&self, status: &str, output: Vec<Value>, d: Option<&Done>) -> Value {
        let incomplete = d.map_or(Value::Null, |d| ending(d).1);
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": null, "incomplete_details": incomplete,
            "instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": true,
            "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": false, "temperature": self.temperature, "top_p": self.top_p,
            "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "truncation": "disabled", "usage": d.map(usage), "metadata": {},
        })
    }

    fn message_id(&self) -> String {
        self.id.replacen("resp_", "msg_", 1)
    }

    /// The assistant message item holding `text`.
    fn message(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([output_text(text)])
        };
        json!({"id": self.message_id(), "type": "message", "role": "assistant",
               "status": status, "content": content})
    }

    /// The parsed calls as `function_call` items.
    fn calls(&self, p: &Parsed) -> Vec<Value> {
        p.calls
            .iter()
            .enumerate()
            .map(|(i, c)| self.call(i, c))
            .collect()
    }

    /// The reply's `i`th call as a `function_call` item.
    fn call(&self, i: usize, c: &ToolCall) -> Value {
        self.call_item(i, &c.id, &c.name, &c.arguments, "completed")
    }

    /// The reply's `i`th call's item, `status` and the arguments so far.
    fn call_item(&self, i: usize, call_id: &str, name: &str, args: &str, status: &str) -> Value {
        json!({"id": format!("fc_{}_{i}", self.id), "type": "function_call",
               "status": status, "call_id": call_id, "name": name, "arguments": args})
    }

    /// The reasoning item, when the reply's reasoning was split from it.
    fn reasoning(&self, p: &Parsed) -> Option<Value> {
        p.reasoning
            .as_deref()
            .map(|r| self.reasoning_item(r, "completed"))
    }

    fn reasoning_id(&self) -> String {
        self.id.replacen("resp_", "rs_", 1)
    }

    /// A reasoning item holding `text` (no content while in progress).
    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "reasoning_text", "text": text}])
        };
        json!({"id": self.reasoning_id(), "type": "reasoning", "summary": [],
               "status": status, "content": content})
    }

    /// The whole response: any reasoning, the message (when it has text or
    /// there are no calls), then the calls.
    fn whole(&self, text: &str, d: &Done) -> Value {
        let p = self.calls.parse(text);
        let calls = self.calls(&p);
        let mut output: Vec<Value> = self.reasoning(&p).into_iter().collect();
        if !p.content.is_empty() || calls.is_empty() {
            output.push(self.message(&p.content, "completed"));
        }
        output.extend(calls);
        self.response(ending(d).0, output, Some(d))
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The whole response once generation ends.
async fn whole(head: Head, rx: mpsc::Receiver<Event>) -> Result<Response, ApiError> {
    routes::whole_reply(rx, |text, d| head.whole(text, d)).await
}

/// One stream's state: the events' numbers, the message item once opened,
/// the items done, and the split that holds back text that may be a call.
pub(super) struct Streamer {
    head: Head,
    seq: u64,
    /// The text streamed so far, once the message item is open.
    text: Option<String>,
    done: Vec<Value>,
    split: Option<ReplyStream>,
    /// The reasoning streamed so far, while its item is open.
    reasoning: Option<String>,
    /// Reasoning that came after the message opened (harmony's channels
    /// may interleave): its own item at the end.
    late_reasoning: String,
    /// The call item being written: its index in `output`, the item and its
    /// arguments so far.
    call: Option<(usize, Value, String)>,
}

impl Streamer {
    pub(super) fn new(head: Head) -> Self {
        let split = Some(head.calls.stream());
        Self {
            head,
            seq: 0,
            text: None,
            done: Vec::new(),
            split,
            reasoning: None,
            late_reasoning: String::new(),
            call: None,
        }
    }

    /// `data` as the event `name`, numbered.
    fn event(&mut self, name: &'static str, mut data: Value) -> (&'static str, Value) {
        data["type"] = name.into();
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        (name, data)
    }

    pub(super) fn opening(&mut self) -> Vec<(&'static str, Value)> {
        let r = self.head.response("in_progress", Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// The message item's index in `output`.
    fn message_index(&self) -> usize {
        self.done.len()
    }

    /// Reasoning shown: the reasoning item opened first if it is not yet
    /// (held for its own item at the end once the message opened).
    fn reasoning(&mut self, shown: &str) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if shown.is_empty() {
            return out;
        }
        if self.text.is_some() {
            self.late_reasoning.push_str(shown);
            return out;
        }
        let (index, item_id) = (self.done.len(), self.head.reasoning_id());
        if self.reasoning.is_none() {
            self.reasoning = Some(String::new());
            let item = self.head.reasoning_item("", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
        }
        if let Some(r) = self.reasoning.as_mut() {
            r.push_str(shown);
        }
        out.push(self.event(
            "response.reasoning_text.delta",
            json!({"output_index": index, "item_id": item_id, "content_index": 0, "delta": shown}),
        ));
        out
    }

    /// The reasoning item closed, when one is open.
    fn close_reasoning(&mut self) -> Vec<(&'static str, Value)> {
        let Some(text) = self.reasoning.take() else {
            return Vec::new();
        };
        let (index, item_id) = (self.done.len(), self.head.reasoning_id());
        let item = self.head.reasoning_item(&text, "completed");
        let out = vec![
            self.event(
                "response.reasoning_text.done",
                json!({"output_index": index, "item_id": item_id, "content_index": 0, "text": text}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item.clone()}),
            ),
        ];
        self.done.push(item);
        out
    }

    /// Text shown: the reasoning item closed and the message item opened
    /// first if they are not yet.
    fn text(&mut self, shown: &str) -> Vec<(&'static str, Value)> {
        let mut out = self.close_reasoning();
        let (index, item_id) = (self.message_index(), self.head.message_id());
        if self.text.is_none() {
            self.text = Some(String::new());
            let item = self.head.message("", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({"output_index": index, "item_id": item_id, "content_index": 0,
                       "part": output_text("")}),
            ));
        }
        if !shown.is_empty() {
            if let Some(t) = self.text.as_mut() {
                t.push_str(shown);
            }
            out.push(self.event(
                "response.output_text.delta",
                json!({"output_index": index, "item_id": item_id, "content_index": 0,
                       "delta": shown, "logprobs": []}),
            ));
        }
        out
    }

    pub(super) fn push(&mut self, piece: &str) -> Vec<(&'static str, Value)> {
        match self.split.as_mut().map(|s| s.push(piece)) {
            Some(shown) => self.shown(&shown),
            None => Vec::new(),
        }
    }

    fn shown(&mut self, shown: &Shown) -> Vec<(&'static str, Value)> {
        // The rest of the call being written comes before what follows it.
        let (more, parts) = shown.continued();
        let mut out: Vec<_> = more.iter().flat_map(|p| self.call_part(p)).collect();
        if !shown.reasoning.is_empty() || !shown.content.is_empty() {
            out.extend(self.close_call());
        }
        out.extend(self.reasoning(&shown.reasoning));
        if !shown.content.is_empty() {
            out.extend(self.text(&shown.content));
        }
        if !parts.is_empty() {
            out.extend(self.close_reasoning());
            out.extend(self.close_message(true));
        }
        for part in parts {
            out.extend(self.call_part(part));
        }
        out
    }

    /// A piece of a call: its first adds its item (in progress, no
    /// arguments); its arguments go out as deltas. The item is done when
    /// the next item starts or the response ends.
    fn call_part(&mut self, part: &CallPart) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if let Some(name) = &part.name {
            out.extend(self.close_call());
            let index = self.done.len();
            let item = self
                .head
                .call_item(part.index, &part.id, name, "", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            self.call = Some((index, item, String::new()));
        }
        let Some((index, item, args)) = self.call.as_mut() else {
            return out;
        };
        if !part.arguments.is_empty() {
            args.push_str(&part.arguments);
            let data =
                json!({"output_index": *index, "item_id": item["id"], "delta": part.arguments});
            out.push(self.event("response.function_call_arguments.delta", data));
        }
        out
    }

    /// The call item being written is done.
    fn close_call(&mut self) -> Vec<(&'static str, Value)> {
        let Some((index, mut item, args)) = self.call.take() else {
            return Vec::new();
        };
        item["status"] = "completed".into();
        item["arguments"] = args.as_str().into();
        let out = vec![
            self.event(
                "response.function_call_arguments.done",
                json!({"output_index": index, "item_id": item["id"], "arguments": args,
                       "name": item["name"]}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ];
        self.done.push(item);
        out
    }

    /// The message item closed (opened first, empty, when the reply has
    /// neither text nor calls).
    fn close_message(&mut self, calls: bool) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.text.is_none() && calls {
            return out;
        }
        if self.text.is_none() {
            out.extend(self.text(""));
        }
        let text = self.text.take().unwrap_or_default();
        let (index, item_id) = (self.message_index(), self.head.message_id());
        out.push(self.event(
            "response.output_text.done",
            json!({"output_index": index, "item_id": item_id, "content_index": 0,
                   "text": text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"output_index": index, "item_id": item_id, "content_index": 0,
                   "part": output_text(&text)}),
        ));
        let item = self.head.message(&text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item.clone()}),
        ));
        self.done.push(item);
        out
    }

    /// The end: text still held back, the message closed, each call as an
    /// item with its arguments, then `response.completed` (or
    /// `.incomplete`).
    pub(super) fn closing(&mut self, d: &Done) -> Vec<(&'static str, Value)> {
        let Some(split) = self.split.take() else {
            return Vec::new();
        };
        let (rest, parsed) = self.head.calls.finish(split);
        let mut out = self.shown(&rest);
        out.extend(self.close_call());
        out.extend(self.close_reasoning());
        out.extend(self.close_message(!parsed.calls.is_empty()));
        let late = std::mem::take(&mut self.late_reasoning);
        if !late.is_empty() {
            out.extend(self.reasoning(&late));
            out.extend(self.close_reasoning());
        }
        let (status, _) = ending(d);
        let r = self
            .head
            .response(status, std::mem::take(&mut self.done), Some(d));
        let name = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        out.push(self.event(name, json!({"response": r})));
        out
    }

    /// A failure after the start: an `error` event, then `response.failed`.
    pub(super) fn failed(&mut self, e: &ApiError) -> Vec<(&'static str, Value)> {
        self.split = None;
        let code = e.kind;
        let mut r = self
            .head
            .response("failed", std::mem::take(&mut self.done), None);
        r["error"] = json!({"code": code, "message": e.message});
        vec![
            self.event(
                "error",
                json!({"code": code, "message": e.message, "param": e.param}),
            ),
            self.event("response.failed", json!({"response": r})),
        ]
    }
}

/// The reply as the Responses API's server-sent events.
fn sse(
    head: Head,
    rx: mpsc::Receiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut s = Streamer::new(head);
    let opening = s.opening();
    let events = ReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Text(t) => s.push(&t),
            Event::Done(d) => s.closing(&d),
            Event::Failed(e) => s.failed(&e),
            Event::Started { .. } => Vec::new(),
        };
        stream::iter(out)
    });
    routes::named_sse(opening, events)
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
