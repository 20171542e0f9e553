//! OpenAI's replies (`/v1/chat/completions`, `/v1/completions`): one
//! `chat.completion` (or `text_completion`) object once the job is done, or
//! its chunks as server-sent events: a role chunk (chat), one chunk per
//! piece of text (a chat's reasoning as `delta.reasoning_content`, its
//! calls as `delta.tool_calls` as each goes out), the finish chunk, the
//! usage chunk when asked for, then `[DONE]`; `finish_reason` "tool_calls"
//! when the model made calls.

use serde_json::{json, Value};

use crate::chat::tool_calls::Parsed;
use crate::serve::answer::{Dialect, Out};
use crate::serve::error::ApiError;
use crate::serve::job::Done;
use crate::serve::split::{finish_reason, ReplySplit, ReplyStream, Shown};

/// One request's reply: what every response object of it carries, and the
/// split of its stream.
pub(crate) struct Reply {
    pub(crate) id: String,
    /// When the request was answered (seconds since the epoch).
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) chat: bool,
    /// How a chat reply's tool calls are split from its text.
    pub(crate) calls: ReplySplit,
    /// The usage chunk is asked for (`stream_options.include_usage`).
    pub(crate) include_usage: bool,
    /// The stream's split (None once it ended).
    pub(crate) split: Option<ReplyStream>,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }

    /// One choice carrying `text` (a delta when streaming).
    fn choice(&self, text: &str, finish: Option<&str>, chunk: bool) -> Value {
        match (self.chat, chunk) {
            (true, true) if finish.is_some() => {
                json!({"index": 0, "delta": {}, "finish_reason": finish})
            }
            (true, true) => json!({"index": 0, "delta": {"content": text}, "finish_reason": null}),
            (true, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            (false, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    /// A streamed piece's choices (a chat's reasoning and content apart).
    fn deltas(&self, shown: &Shown) -> Vec<Value> {
        if self.chat {
            return chat_deltas(shown).collect();
        }
        let text = (!shown.content.is_empty()).then(|| self.choice(&shown.content, None, true));
        text.into_iter().collect()
    }

    fn envelope(&self, choices: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// Each choice as its chunk.
    fn chunks(&self, choices: Vec<Value>) -> Vec<Out> {
        choices
            .into_iter()
            .map(|c| Out::data(&self.envelope(json!([c]), true)))
            .collect()
    }
}

impl Dialect for Reply {
    fn opening(&mut self) -> Vec<Out> {
        if !self.chat {
            return Vec::new();
        }
        let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]);
        vec![Out::data(&self.envelope(role, true))]
    }

    fn text(&mut self, piece: &str) -> Vec<Out> {
        match self.split.as_mut().map(|s| s.push(piece)) {
            Some(shown) => self.chunks(self.deltas(&shown)),
            None => Vec::new(),
        }
    }

    fn closing(&mut self, d: &Done) -> Vec<Out> {
        let Some(split) = self.split.take() else {
            return Vec::new();
        };
        let (rest, finish) = self.calls.end(split, d.finish_reason);
        let mut out = self.chunks(self.deltas(&rest));
        // The finish chunk carries bmoe's notes (a reply cut short says so).
        let mut last = self.envelope(json!([self.choice("", Some(finish), true)]), true);
        last["bmoe"] = json!({"notes": d.notes});
        out.push(Out::data(&last));
        if self.include_usage {
            let mut u = self.envelope(json!([]), true);
            u["usage"] = usage(d);
            u["bmoe"] = extra(d);
            out.push(Out::data(&u));
        }
        out.push(Out::text("[DONE]"));
        out
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Out> {
        vec![Out::data(&e.json())]
    }

    fn whole(&self, text: &str, d: &Done) -> Value {
        let choice = if self.chat {
            chat_choice(&self.calls, text, d.finish_reason)
        } else {
            self.choice(text, Some(d.finish_reason), false)
        };
        let mut body = self.envelope(json!([choice]), false);
        body["usage"] = usage(d);
        body["bmoe"] = extra(d);
        body
    }
}

fn usage(d: &Done) -> Value {
    json!({"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
           "total_tokens": d.prompt_tokens + d.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": d.figures.reused_tokens}})
}

/// What bmoe adds to a response: the notes and the turn's own figures.
fn extra(d: &Done) -> Value {
    let f = &d.figures;
    json!({"notes": d.notes, "prefilled_tokens": f.prefilled_tokens, "reused_tokens": f.reused_tokens,
           "decode_tok_s": f.decode_tok_s(), "flash_read_bytes": f.metrics.read_bytes,
           "cache_hit_pct": f.hit_pct(), "drafted_tokens": f.drafted_tokens,
           "accepted_tokens": f.accepted_tokens})
}

/// A whole chat reply's choice: its message (reasoning, content, calls) and
/// finish reason.
pub(crate) fn chat_choice(split: &ReplySplit, text: &str, finish: &'static str) -> Value {
    let p = split.parse(text);
    let content = if p.content.is_empty() && !p.calls.is_empty() {
        Value::Null
    } else {
        p.content.as_str().into()
    };
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(r) = &p.reasoning {
        message["reasoning_content"] = r.as_str().into();
    }
    if !p.calls.is_empty() {
        message["tool_calls"] = calls_json(&p);
    }
    json!({"index": 0, "message": message, "finish_reason": finish_reason(&p, finish)})
}

/// The `delta`s of a streamed piece's calls: a call's index, id and name
/// (its arguments empty) when it starts, then each piece of its arguments.
pub(crate) fn call_deltas(shown: &Shown) -> Vec<Value> {
    let mut out = Vec::with_capacity(2 * shown.parts.len());
    for p in &shown.parts {
        if let Some(name) = &p.name {
            out.push(
                json!({"tool_calls": [{"index": p.index, "id": p.id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            );
        }
        if !p.arguments.is_empty() {
            out.push(
                json!({"tool_calls": [{"index": p.index, "function": {"arguments": p.arguments}}]}),
            );
        }
    }
    out
}

/// A streamed piece's choices: its reasoning (`delta.reasoning_content`),
/// its content, then its calls (`delta.tool_calls`), each when there is some.
pub(crate) fn chat_deltas(shown: &Shown) -> impl Iterator<Item = Value> + Send {
    let reasoning =
        (!shown.reasoning.is_empty()).then(|| json!({"reasoning_content": shown.reasoning}));
    let content = (!shown.content.is_empty()).then(|| json!({"content": shown.content}));
    reasoning
        .into_iter()
        .chain(content)
        .chain(call_deltas(shown))
        .map(|delta| json!({"index": 0, "delta": delta, "finish_reason": null}))
}

/// `[{id, type, function: {name, arguments}}]`.
fn calls_json(p: &Parsed) -> Value {
    p.calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
