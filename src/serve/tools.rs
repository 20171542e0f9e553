//! A chat reply's tool calls in OpenAI's shapes: `message.tool_calls` in a
//! whole reply, `delta.tool_calls` chunks at the end of a stream, and
//! `finish_reason` "tool_calls" when the model made any. Calls are parsed
//! ([`crate::chat::tool_calls`]) when the request offered tools and the
//! template's format is known; gpt-oss's harmony framing is always split
//! (its analysis channel goes to `reasoning_content`, out of the content).

use serde_json::{json, Value};

use super::api::{JobSpec, PromptSpec};
use crate::chat::tool_calls::{parse_with_tools, CallFormat, CallStream, Parsed};

/// How one request's reply is split.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplySplit {
    format: CallFormat,
    /// The request's tools (their schemas type XML parameters).
    tools: Option<Value>,
}

impl ReplySplit {
    /// The split for `spec` under a template whose calls look like `format`.
    pub(crate) fn of(spec: &JobSpec, format: CallFormat) -> Self {
        match &spec.prompt {
            PromptSpec::Chat {
                tools: Some(tools), ..
            } => Self {
                format,
                tools: Some(tools.clone()),
            },
            PromptSpec::Chat { .. } if format == CallFormat::Harmony => Self {
                format,
                tools: None,
            },
            _ => Self::default(),
        }
    }

    /// Whether the reply must be detokenized with its special tokens as
    /// text: the format's call markers are control tokens.
    pub(crate) fn special_text(&self) -> bool {
        self.format.special_text(self.tools.is_some())
    }

    /// A split in `format` for a request that offered `tools`.
    #[cfg(test)]
    pub(crate) fn new(format: CallFormat, tools: Option<Value>) -> Self {
        Self { format, tools }
    }

    /// A whole reply split into content and calls.
    pub(crate) fn parse(&self, text: &str) -> Parsed {
        parse_with_tools(self.format, text, self.tools.as_ref())
    }

    /// The end of a streaming split: the text still held back and the calls.
    pub(crate) fn finish(&self, split: CallStream) -> (String, Parsed) {
        split.finish(self.tools.as_ref())
    }

    /// A streaming split.
    pub(crate) fn stream(&self) -> CallStream {
        CallStream::new(self.format)
    }

    /// The whole reply's choice: its message and finish reason.
    pub(crate) fn choice(&self, text: &str, finish: &'static str) -> Value {
        let p = self.parse(text);
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
            message["tool_calls"] = calls_json(&p, false);
        }
        json!({"index": 0, "message": message, "finish_reason": finish_reason(&p, finish)})
    }

    /// The end of a stream: the content still held back (may be empty), the
    /// `delta`s of the calls, and the finish reason.
    pub(crate) fn end(
        &self,
        split: CallStream,
        finish: &'static str,
    ) -> (String, Vec<Value>, &'static str) {
        let (rest, p) = self.finish(split);
        let deltas = match calls_json(&p, true) {
            Value::Array(v) => v.into_iter().map(|c| json!({"tool_calls": [c]})).collect(),
            _ => Vec::new(),
        };
        (rest, deltas, finish_reason(&p, finish))
    }
}

/// "tool_calls" when the model made calls, else the generation's own.
fn finish_reason(p: &Parsed, finish: &'static str) -> &'static str {
    if p.calls.is_empty() {
        finish
    } else {
        "tool_calls"
    }
}

/// `[{id, type, function: {name, arguments}}]` (with `index` in a stream).
fn calls_json(p: &Parsed, indexed: bool) -> Value {
    p.calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}});
            if indexed {
                v["index"] = i.into();
            }
            v
        })
        .collect()
}
