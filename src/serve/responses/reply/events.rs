//! The Responses API's server-sent events for one reply: the reasoning
//! item, the message item and each `function_call` item opened, filled by
//! deltas and done in the order the dialect requires, then the response's
//! ending.

use serde_json::{json, Value};

use super::{ending, output_text, Head};
use crate::chat::tool_calls::CallPart;
use crate::serve::answer::{named, Dialect, Out};
use crate::serve::error::ApiError;
use crate::serve::job::Done;
use crate::serve::split::{ReplyStream, Shown};

/// One stream's state: the events' numbers, the message item once opened,
/// the items done, and the split that holds back text that may be a call.
pub(crate) struct Streamer {
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
    pub(crate) fn new(head: Head) -> Self {
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

impl Dialect for Streamer {
    fn opening(&mut self) -> Vec<Out> {
        named(Streamer::opening(self))
    }

    fn text(&mut self, piece: &str) -> Vec<Out> {
        named(self.push(piece))
    }

    fn closing(&mut self, done: &Done) -> Vec<Out> {
        named(Streamer::closing(self, done))
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Out> {
        named(Streamer::failed(self, e))
    }

    fn whole(&self, text: &str, done: &Done) -> Value {
        self.head.whole(text, done)
    }
}
