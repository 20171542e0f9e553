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

use serde_json::{json, Value};

use crate::chat::tool_calls::{Parsed, ToolCall};
use crate::serve::job::Done;
use crate::serve::split::ReplySplit;

/// What every part of one reply carries.
pub(crate) struct Head {
    pub(crate) id: String,
    pub(crate) created_at: u64,
    pub(crate) model: String,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<i64>,
    pub(crate) temperature: f32,
    pub(crate) top_p: f32,
    /// How the reply's text splits into text and function calls.
    pub(crate) calls: ReplySplit,
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

pub(super) mod events;

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
