//! A reply split as it streams: the content goes out as it comes, except
//! text that could be the start of a call (or of harmony framing), which is
//! held until the next piece decides; the calls come out at the end.

use serde_json::Value;

use super::{harmony, parse_with_tools, partial_marker, CallFormat, Parsed};

/// One streaming reply's split.
#[derive(Debug, Default)]
pub struct CallStream {
    format: CallFormat,
    /// The reply so far.
    text: String,
    /// The content already handed out.
    sent: String,
    /// A call opened: no more content until the end.
    in_calls: bool,
    /// Harmony's reasoning (its analysis channel) already handed out, and
    /// what the last piece added to it.
    reasoning_sent: String,
    reasoning_new: String,
}

impl CallStream {
    pub fn new(format: CallFormat) -> Self {
        Self {
            format,
            ..Self::default()
        }
    }

    /// Take the next piece of the reply; the content that can go out now.
    pub fn push(&mut self, piece: &str) -> String {
        if self.format == CallFormat::None {
            self.sent.push_str(piece);
            return piece.to_string();
        }
        self.text.push_str(piece);
        let ready = match self.format {
            CallFormat::Harmony => {
                let p = harmony::parse(&self.text, true);
                self.reasoning_advance(p.reasoning.as_deref().unwrap_or(""));
                p.content
            }
            _ => self.before_calls(),
        };
        self.advance(&ready)
    }

    /// The reasoning the pieces since the last call made known (harmony's
    /// analysis channel; empty for the other formats).
    pub fn take_reasoning(&mut self) -> String {
        std::mem::take(&mut self.reasoning_new)
    }

    fn reasoning_advance(&mut self, ready: &str) {
        if let Some(new) = ready.strip_prefix(self.reasoning_sent.as_str()) {
            self.reasoning_new.push_str(new);
            self.reasoning_sent.push_str(new);
        }
    }

    /// The reply ended: the content not yet handed out, and the whole split
    /// (its content is what went out plus that rest).
    pub fn finish(self, tools: Option<&Value>) -> (String, Parsed) {
        let parsed = match self.format {
            CallFormat::None => Parsed {
                content: self.sent.clone(),
                ..Parsed::default()
            },
            f => parse_with_tools(f, &self.text, tools),
        };
        let rest = parsed
            .content
            .strip_prefix(self.sent.as_str())
            .unwrap_or("")
            .to_string();
        (rest, parsed)
    }

    /// The framed formats: the text before the first call, less a possible
    /// partial opening marker and the whitespace before it.
    fn before_calls(&mut self) -> String {
        let Some(frame) = self.format.frame() else {
            return self.text.clone();
        };
        if self.in_calls {
            return self.sent.clone();
        }
        let end = match self.text.find(frame.open) {
            Some(at) => {
                self.in_calls = true;
                at
            }
            None => self.text.len() - partial_marker(&self.text, frame.open),
        };
        self.text[..end].trim_end().to_string()
    }

    /// Hand out what `ready` has beyond what went out.
    fn advance(&mut self, ready: &str) -> String {
        match ready.strip_prefix(self.sent.as_str()) {
            Some(new) if !new.is_empty() => {
                let new = new.to_string();
                self.sent.push_str(&new);
                new
            }
            _ => String::new(),
        }
    }
}

/// Bytes at the end of `text` that could start any of `markers`.
pub(super) fn held_for_any(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| partial_marker(text, m))
        .max()
        .unwrap_or(0)
}
