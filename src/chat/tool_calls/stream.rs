//! A reply split as it streams. The content goes out as it comes, except
//! text that could be the start of a call (or of harmony framing), which is
//! held until the next piece decides. Each call goes out as soon as it is
//! decided: when its block's closing marker comes (harmony: its message's
//! end), parsed as the whole reply's parse would; a block that does not
//! parse is content. After the first call the content is held to the end
//! (the whole split trims it there), and a block that runs to the end of
//! the reply (Mistral's) is decided at the end.

use serde_json::Value;

use super::{calls_in, harmony, parse_with_tools, partial_marker, CallFormat, Parsed, ToolCall};

/// One streaming reply's split.
#[derive(Debug, Default)]
pub struct CallStream {
    format: CallFormat,
    /// The request's tools (their schemas type XML parameters).
    tools: Option<Value>,
    /// The reply so far.
    text: String,
    /// The content already handed out.
    sent: String,
    /// Bytes of `text` decided (content or calls), in the framed formats.
    scan: usize,
    /// The content of the decided bytes.
    content: String,
    /// `content`'s length when the first call was decided.
    before_calls: Option<usize>,
    /// The calls decided, and how many of them were handed out.
    calls: Vec<ToolCall>,
    taken: usize,
    /// Harmony's reasoning (its analysis channel) already handed out, and
    /// what the last piece added to it.
    reasoning_sent: String,
    reasoning_new: String,
}

impl CallStream {
    pub fn new(format: CallFormat) -> Self {
        Self::with_tools(format, None)
    }

    /// A split whose XML parameters are typed by the request's `tools`.
    pub fn with_tools(format: CallFormat, tools: Option<Value>) -> Self {
        Self {
            format,
            tools,
            ..Self::default()
        }
    }

    /// Take the next piece of the reply; the content that can go out now
    /// (the calls it decided: [`CallStream::take_calls`]).
    pub fn push(&mut self, piece: &str) -> String {
        if self.format == CallFormat::None {
            self.sent.push_str(piece);
            return piece.to_string();
        }
        self.text.push_str(piece);
        let ready = match self.format {
            CallFormat::Harmony => self.harmony(),
            _ => self.framed(),
        };
        self.advance(ready.trim_end())
    }

    /// The calls decided since the last take, in order.
    pub fn take_calls(&mut self) -> Vec<ToolCall> {
        let new = self.calls[self.taken..].to_vec();
        self.taken = self.calls.len();
        new
    }

    /// The reasoning the pieces since the last call made known (harmony's
    /// analysis channel; empty for the other formats).
    pub fn take_reasoning(&mut self) -> String {
        std::mem::take(&mut self.reasoning_new)
    }

    /// The reply ended: the content not yet handed out, the calls not yet
    /// taken, and the whole split (its content is what went out plus that
    /// rest; its calls, those taken first, keep their ids).
    pub fn finish(self) -> (String, Vec<ToolCall>, Parsed) {
        let mut parsed = match self.format {
            CallFormat::None => Parsed {
                content: self.sent.clone(),
                ..Parsed::default()
            },
            f => parse_with_tools(f, &self.text, self.tools.as_ref()),
        };
        for (whole, sent) in parsed.calls.iter_mut().zip(&self.calls) {
            debug_assert_eq!(
                (&whole.name, &whole.arguments),
                (&sent.name, &sent.arguments),
                "a call decided while streaming is the whole parse's"
            );
            whole.id.clone_from(&sent.id);
        }
        let rest = parsed
            .content
            .strip_prefix(self.sent.as_str())
            .unwrap_or("")
            .to_string();
        let new = parsed.calls.get(self.taken..).unwrap_or_default().to_vec();
        (rest, new, parsed)
    }

    /// Harmony: the content so far (none more once a call came), the
    /// closed calls and the reasoning.
    fn harmony(&mut self) -> String {
        let p = harmony::parse(&self.text, true);
        self.reasoning_advance(p.reasoning.as_deref().unwrap_or(""));
        if self.calls.is_empty() && !p.calls.is_empty() {
            self.before_calls = Some(0);
        }
        let known = self.calls.len();
        self.calls.extend(p.calls.into_iter().skip(known));
        match self.before_calls {
            Some(_) => self.sent.clone(),
            None => p.content,
        }
    }

    /// The framed formats: decide the blocks that closed; the content
    /// before the first call, or all of it less a possible partial opening
    /// marker while there is none.
    fn framed(&mut self) -> String {
        let Some(frame) = self.format.frame() else {
            return self.text.clone();
        };
        while let Some(n) = self.decide_block(frame.open, frame.close) {
            self.scan += n;
        }
        if let Some(end) = self.before_calls {
            return self.content[..end].to_string();
        }
        let rest = &self.text[self.scan..];
        let end = rest
            .find(frame.open)
            .unwrap_or(rest.len() - partial_marker(rest, frame.open));
        format!("{}{}", self.content, &rest[..end])
    }

    /// The next block after `scan`, when it closed: its text before it and
    /// its calls (or all of it as content, when it does not parse); the
    /// bytes it took.
    fn decide_block(&mut self, open: &str, close: Option<&str>) -> Option<usize> {
        let rest = &self.text[self.scan..];
        let at = rest.find(open)?;
        let after = at + open.len();
        let end = rest[after..].find(close?)?;
        let taken = after + end + close.map_or(0, str::len);
        let calls = calls_in(self.format, &rest[after..after + end], self.tools.as_ref())
            .filter(|c| !c.is_empty());
        match calls {
            Some(calls) => {
                self.content.push_str(&rest[..at]);
                self.before_calls.get_or_insert(self.content.len());
                self.calls.extend(calls);
            }
            None => self.content.push_str(&rest[..taken]),
        }
        Some(taken)
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

    fn reasoning_advance(&mut self, ready: &str) {
        if let Some(new) = ready.strip_prefix(self.reasoning_sent.as_str()) {
            self.reasoning_new.push_str(new);
            self.reasoning_sent.push_str(new);
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
