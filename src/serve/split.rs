//! A chat reply split for every dialect: its reasoning (a `<think>` block,
//! [`crate::chat::reasoning`], under a template that writes them), its
//! content and its tool calls, whole ([`ReplySplit::parse`]) or as it
//! streams ([`ReplyStream`]: each piece's reasoning, content and the calls'
//! pieces it made known; a reply held to the format by a grammar: a call's
//! name first, then its arguments as they are written); each dialect's
//! `reply.rs` gives the parts its own shapes. Calls are parsed
//! ([`crate::chat::tool_calls`]) when the request offered tools and the
//! template's format is known; gpt-oss's harmony framing is always split
//! (its analysis channel goes to `reasoning_content`, out of the content).

use serde_json::Value;

use super::job::{JobSpec, PromptSpec, Started};
use crate::chat::reasoning::{self, ThinkStream};
use crate::chat::tool_calls::{parse_with_tools, CallFormat, CallPart, CallStream, Parsed};

/// How one request's reply is split.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplySplit {
    format: CallFormat,
    /// The request's tools (their schemas type XML parameters).
    tools: Option<Value>,
    /// `Some(open)`: the template writes `<think>` blocks, and `open` says
    /// the prompt opened one (the reply starts with reasoning).
    think: Option<bool>,
    /// A grammar holds the reply's calls to the format: they go out as they
    /// are written.
    live: bool,
}

/// A streaming reply's split: its reasoning block first, then its calls.
#[derive(Debug, Default)]
pub(crate) struct ReplyStream {
    think: Option<ThinkStream>,
    calls: CallStream,
    /// The reasoning handed out so far.
    reasoning: String,
}

/// What a piece of a streaming reply made known.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) reasoning: String,
    pub(crate) content: String,
    /// The calls' pieces it made known.
    pub(crate) parts: Vec<CallPart>,
}

impl Shown {
    /// The calls' pieces split where the first new call starts: the rest of
    /// the call already going out (which comes before this piece's reasoning
    /// and content), then the new calls.
    pub(crate) fn continued(&self) -> (&[CallPart], &[CallPart]) {
        let first_new = self
            .parts
            .iter()
            .position(|p| p.name.is_some())
            .unwrap_or(self.parts.len());
        self.parts.split_at(first_new)
    }
}

impl ReplyStream {
    /// Take the next piece of the reply.
    pub(crate) fn push(&mut self, piece: &str) -> Shown {
        let answer = match self.think.as_mut() {
            Some(t) => {
                let d = t.push(piece);
                self.reasoning.push_str(&d.reasoning);
                let mut shown = self.answer(&d.answer);
                shown.reasoning.insert_str(0, &d.reasoning);
                return shown;
            }
            None => piece,
        };
        self.answer(answer)
    }

    /// Answer text through the call split (harmony's reasoning comes out of it).
    fn answer(&mut self, text: &str) -> Shown {
        let content = if text.is_empty() {
            String::new()
        } else {
            self.calls.push(text)
        };
        let reasoning = self.calls.take_reasoning();
        self.reasoning.push_str(&reasoning);
        Shown {
            reasoning,
            content,
            parts: self.calls.take_parts(),
        }
    }
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
                ..Self::default()
            },
            PromptSpec::Chat { .. } if format == CallFormat::Harmony => Self {
                format,
                ..Self::default()
            },
            _ => Self::default(),
        }
    }

    /// The same split, reasoning blocks split off first when `on` (a chat
    /// under a template that writes them); `open`: the prompt opened one.
    pub(crate) fn thinking(mut self, on: bool, open: bool) -> Self {
        if on {
            self.think = Some(open);
        }
        self
    }

    /// The same split, its calls streamed as they are written when `held`
    /// (a grammar holds them to the format).
    pub(crate) fn held(mut self, held: bool) -> Self {
        self.live = held && self.tools.is_some();
        self
    }

    /// The split for a job as it started: `thinks` (the template writes
    /// reasoning blocks and this is a chat), the prompt's open block, the
    /// grammar on its calls.
    pub(crate) fn started(self, thinks: bool, started: &Started) -> Self {
        self.thinking(thinks, started.reasoning_open)
            .held(started.calls_held)
    }

    /// Whether the reply must be detokenized with its special tokens as
    /// text: the format's call markers are control tokens.
    pub(crate) fn special_text(&self) -> bool {
        self.format.special_text(self.tools.is_some())
    }

    /// A split in `format` for a request that offered `tools`.
    #[cfg(test)]
    pub(crate) fn new(format: CallFormat, tools: Option<Value>) -> Self {
        Self {
            format,
            tools,
            ..Self::default()
        }
    }

    /// As [`ReplySplit::new`], for a template that writes reasoning blocks.
    #[cfg(test)]
    pub(crate) fn new_thinking(format: CallFormat, tools: Option<Value>, open: bool) -> Self {
        Self {
            think: Some(open),
            ..Self::new(format, tools)
        }
    }

    /// A whole reply split into reasoning, content and calls.
    pub(crate) fn parse(&self, text: &str) -> Parsed {
        let Some(open) = self.think else {
            return parse_with_tools(self.format, text, self.tools.as_ref());
        };
        let (reasoning, answer) = reasoning::split(text, open);
        let mut p = parse_with_tools(self.format, &answer, self.tools.as_ref());
        p.reasoning = join(reasoning, p.reasoning.take());
        p
    }

    /// The end of a streaming split: what was still held back and the
    /// whole split (its reasoning and content are what went out plus that
    /// rest).
    pub(crate) fn finish(&self, mut split: ReplyStream) -> (Shown, Parsed) {
        let mut rest = Shown::default();
        if let Some(t) = split.think.take() {
            let d = t.finish();
            split.reasoning.push_str(&d.reasoning);
            rest = split.answer(&d.answer);
            rest.reasoning.insert_str(0, &d.reasoning);
        }
        let (content, parts, mut p) = split.calls.finish();
        rest.content.push_str(&content);
        rest.parts.extend(parts);
        if self.think.is_some() {
            p.reasoning = Some(split.reasoning);
        }
        (rest, p)
    }

    /// A streaming split.
    pub(crate) fn stream(&self) -> ReplyStream {
        ReplyStream {
            think: self.think.map(ThinkStream::new),
            calls: CallStream::with_tools(self.format, self.tools.clone()).live(self.live),
            ..ReplyStream::default()
        }
    }

    /// The end of a stream: what was still held back (text, calls), and
    /// the finish reason.
    pub(crate) fn end(&self, split: ReplyStream, finish: &'static str) -> (Shown, &'static str) {
        let (rest, p) = self.finish(split);
        (rest, finish_reason(&p, finish))
    }
}

/// Two reasonings in one (either may be missing).
fn join(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + &b),
        (a, b) => a.or(b),
    }
}

/// "tool_calls" when the model made calls (and ended after the last), else
/// the generation's own.
pub(crate) fn finish_reason(p: &Parsed, finish: &'static str) -> &'static str {
    if p.calls.is_empty() || p.cut {
        finish
    } else {
        "tool_calls"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}}])
    }

    /// gpt-oss's analysis channel streams as reasoning before the final
    /// channel's content; its call goes out once its message ends.
    #[test]
    fn a_harmony_stream_sends_its_analysis_as_reasoning_first() {
        let split = ReplySplit::new(CallFormat::Harmony, Some(tools()));
        let reply = concat!(
            "<|channel|>analysis<|message|>Look it up.<|end|>",
            "<|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json",
            "<|message|>{\"n\": 2}<|call|>"
        );
        let mut s = split.stream();
        let (mut reasoning, mut calls, mut content) = (String::new(), Vec::new(), String::new());
        for piece in reply.as_bytes().chunks(4) {
            let p = s.push(std::str::from_utf8(piece).expect("ASCII"));
            reasoning.push_str(&p.reasoning);
            content.push_str(&p.content);
            calls.extend(p.parts);
        }
        assert_eq!(reasoning, "Look it up.");
        assert_eq!(content, "");
        assert_eq!(calls.len(), 1, "the call before the end");
        assert_eq!(
            (calls[0].name.as_deref(), calls[0].arguments.as_str()),
            (Some("lookup"), "{\"n\":2}")
        );
        let (rest, finish) = split.end(s, "stop");
        assert!(rest.parts.is_empty() && rest.content.is_empty());
        assert_eq!(finish, "tool_calls");
    }
}
