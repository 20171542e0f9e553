//! A reply split as it streams. The content goes out as it comes, except
//! text that could be the start of a call (or of harmony framing), which is
//! held until the next piece decides. Each call goes out as soon as it is
//! decided: when its block's closing marker comes (harmony: its message's
//! end), parsed as the whole reply's parse would; a block that does not
//! parse is content. After the first call the content is held to the end
//! (the whole split trims it there), and a block that runs to the end of
//! the reply (Mistral's) is decided at the end.
//!
//! Under a grammar that holds the reply to the format ([`CallStream::live`])
//! a call goes out as it is written instead: its name as soon as the block
//! shows it, then its arguments as they grow ([`super::partial`]: each
//! whole member, and a string value as it is written), the rest once the
//! block closes. A block under a grammar cannot turn out malformed, so
//! nothing that went out is taken back.

use serde_json::Value;

use super::call::{call_id, Parsed, ToolCall};
use super::formats::CallFormat;
use super::markers::partial_marker;
use super::partial::Open;

/// A piece of a call as it goes out: the first piece of each call names it
/// (with its id), and its pieces' `arguments` joined are its whole
/// arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPart {
    /// The call's place among the reply's calls.
    pub index: usize,
    pub id: String,
    /// The call's name, in its first piece only.
    pub name: Option<String>,
    pub arguments: String,
}

/// A call handed out (or being handed out).
#[derive(Debug)]
struct Sent {
    id: String,
    name: String,
    /// Its arguments so far, and what would close them into an object.
    args: String,
    closing: &'static str,
    /// Where the block (harmony: the message) holding it starts in the reply.
    block_at: usize,
}

/// One streaming reply's split.
#[derive(Debug, Default)]
pub struct CallStream {
    format: CallFormat,
    /// The request's tools (their schemas type XML parameters).
    tools: Option<Value>,
    /// Calls go out as they are written (the reply is held to the format by
    /// a grammar, so a block that opens closes well-formed): the name as
    /// soon as it is known, then the arguments as they come.
    live: bool,
    /// The reply so far.
    text: String,
    /// The content already handed out.
    sent: String,
    /// Bytes of `text` decided (content or calls), in the framed formats.
    scan: usize,
    /// The content of the decided bytes.
    content: String,
    /// The content's length before the first call (once there is one).
    before_calls: Option<usize>,
    /// The calls handed out, and how many of them are whole (their block
    /// closed); the pieces not yet taken.
    calls: Vec<Sent>,
    decided: usize,
    parts: Vec<CallPart>,
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

    /// The same split with calls handed out as they are written (see
    /// [`CallPart`]): only for a reply held to the format by a grammar, in
    /// which a call that opens closes well-formed (a call cut by the reply's
    /// end is closed with the arguments it had).
    pub fn live(mut self, on: bool) -> Self {
        self.live = on;
        self
    }

    /// Take the next piece of the reply; the content that can go out now
    /// (the calls' pieces: [`CallStream::take_parts`]).
    pub fn push(&mut self, piece: &str) -> String {
        let syntax = self.format.syntax();
        if !syntax.reads_calls() {
            self.sent.push_str(piece);
            return piece.to_string();
        }
        self.text.push_str(piece);
        let ready = match syntax.split_so_far(&self.text) {
            Some(so_far) => self.unframed(so_far),
            None => self.framed(),
        };
        self.advance(ready.trim_end())
    }

    /// The calls' pieces made known since the last take, in order.
    pub fn take_parts(&mut self) -> Vec<CallPart> {
        std::mem::take(&mut self.parts)
    }

    /// The reasoning the pieces since the last call made known (harmony's
    /// analysis channel; empty for the other formats).
    pub fn take_reasoning(&mut self) -> String {
        std::mem::take(&mut self.reasoning_new)
    }

    /// The reply ended: the content not yet handed out, the calls' pieces
    /// not yet taken, and the whole split (its content is what went out plus
    /// that rest; its calls keep the ids they went out with). A call being
    /// written when the reply ended (cut by its length) is closed with the
    /// arguments it had.
    pub fn finish(mut self) -> (String, Vec<CallPart>, Parsed) {
        let syntax = self.format.syntax();
        let mut parsed = if syntax.reads_calls() {
            syntax.parse(&self.text, self.tools.as_ref())
        } else {
            Parsed {
                content: self.sent.clone(),
                ..Parsed::default()
            }
        };
        if parsed.calls.len() < self.calls.len() && self.decided < self.calls.len() {
            parsed = self.with_cut_calls();
        }
        for (i, whole) in parsed.calls.iter_mut().enumerate() {
            self.decide(i, whole);
        }
        let rest = parsed
            .content
            .strip_prefix(self.sent.as_str())
            .unwrap_or("")
            .to_string();
        (rest, std::mem::take(&mut self.parts), parsed)
    }

    /// The whole split of a reply that ended inside a block whose calls had
    /// gone out: the reply before that block, then those calls closed.
    fn with_cut_calls(&self) -> Parsed {
        let at = self.calls[self.decided].block_at;
        let syntax = self.format.syntax();
        let mut p = syntax.parse(&self.text[..at], self.tools.as_ref());
        debug_assert_eq!(
            p.calls.len(),
            self.decided,
            "the calls before the cut block"
        );
        for s in &self.calls[p.calls.len()..] {
            p.calls.push(ToolCall {
                id: s.id.clone(),
                name: s.name.clone(),
                arguments: format!("{}{}", s.args, s.closing),
            });
        }
        p.content.truncate(p.content.trim_end().len());
        p.cut = true;
        p
    }

    /// A format not framed in blocks (harmony), from its split so far `p`:
    /// the content so far (none more once a call came), the closed calls,
    /// the call being written, and the reasoning.
    fn unframed(&mut self, p: Parsed) -> String {
        self.reasoning_advance(p.reasoning.as_deref().unwrap_or(""));
        if !p.calls.is_empty() {
            self.before_calls.get_or_insert(0);
        }
        for (i, mut c) in p.calls.into_iter().enumerate().skip(self.decided) {
            self.decide(i, &mut c);
        }
        if self.live {
            if let Some((at, open)) = self.format.syntax().open_call(&self.text) {
                self.show(vec![open], at, 0);
            }
        }
        match self.before_calls {
            Some(_) => self.sent.clone(),
            None => p.content,
        }
    }

    /// The framed formats: decide the blocks that closed, show the calls of
    /// one still open; the content before the first call, or all of it
    /// less a possible partial opening marker while there is none.
    fn framed(&mut self) -> String {
        let syntax = self.format.syntax();
        let Some(frame) = syntax.frame() else {
            return self.text.clone();
        };
        while let Some(n) = self.decide_block(frame.open, frame.close) {
            self.scan += n;
        }
        let open_at = self.text[self.scan..].find(frame.open);
        if let Some(at) = open_at.filter(|_| self.live) {
            let block_at = self.scan + at;
            let body = &self.text[block_at + frame.open.len()..];
            let opens = syntax.open_calls(body, self.tools.as_ref());
            self.show(opens, block_at, self.content.len() + at);
        }
        let rest = &self.text[self.scan..];
        let end = open_at.unwrap_or(rest.len() - partial_marker(rest, frame.open));
        let shown = format!("{}{}", self.content, &rest[..end]);
        match self.before_calls {
            Some(n) => shown[..n.min(shown.len())].to_string(),
            None => shown,
        }
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
        let syntax = self.format.syntax();
        let calls = syntax
            .calls(&rest[after..after + end], self.tools.as_ref())
            .filter(|c| !c.is_empty());
        match calls {
            Some(mut calls) => {
                self.content.push_str(&rest[..at]);
                self.before_calls.get_or_insert(self.content.len());
                for c in &mut calls {
                    self.decide(self.decided, c);
                }
            }
            None => {
                if self.calls.len() > self.decided {
                    tracing::warn!("a call that went out as it was written did not close well-formed: it stays as it went out");
                }
                self.content.push_str(&rest[..taken]);
            }
        }
        Some(taken)
    }

    /// The reply's `i`th call is whole: the rest of it goes out (all of it
    /// when none went out yet), and it takes the id it went out with.
    fn decide(&mut self, i: usize, whole: &mut ToolCall) {
        self.decided = self.decided.max(i + 1);
        let Some(s) = self.calls.get_mut(i) else {
            self.parts.push(CallPart {
                index: i,
                id: whole.id.clone(),
                name: Some(whole.name.clone()),
                arguments: whole.arguments.clone(),
            });
            self.calls.push(Sent {
                id: whole.id.clone(),
                name: whole.name.clone(),
                args: whole.arguments.clone(),
                closing: "",
                block_at: self.text.len(),
            });
            return;
        };
        whole.id.clone_from(&s.id);
        match whole.arguments.strip_prefix(s.args.as_str()) {
            Some("") => {}
            Some(more) => self.parts.push(CallPart {
                index: i,
                id: s.id.clone(),
                name: None,
                arguments: more.to_string(),
            }),
            None => tracing::warn!(
                "call {i}'s arguments as streamed differ from its whole parse ({:?} then {:?})",
                s.args,
                whole.arguments
            ),
        }
        debug_assert_eq!(
            s.name, whole.name,
            "a call's name as it went out is its whole parse's"
        );
        s.args.clone_from(&whole.arguments);
        s.closing = "";
    }

    /// The calls of the block at `block_at` as written so far (numbered
    /// from the first not yet whole): the name of each new one, then what
    /// its arguments grew by. `hold`: the content's length before that block.
    fn show(&mut self, opens: Vec<Open>, block_at: usize, hold: usize) {
        for (k, open) in opens.into_iter().enumerate() {
            let index = self.decided + k;
            let Some(s) = self.calls.get_mut(index) else {
                self.before_calls.get_or_insert(hold);
                let id = call_id();
                self.parts.push(CallPart {
                    index,
                    id: id.clone(),
                    name: Some(open.name.clone()),
                    arguments: open.args.text.clone(),
                });
                self.calls.push(Sent {
                    id,
                    name: open.name,
                    args: open.args.text,
                    closing: open.args.closing,
                    block_at,
                });
                continue;
            };
            let more = match open.args.text.strip_prefix(s.args.as_str()) {
                Some(more) if !more.is_empty() => more.to_string(),
                _ => continue,
            };
            self.parts.push(CallPart {
                index,
                id: s.id.clone(),
                name: None,
                arguments: more,
            });
            s.args = open.args.text;
            s.closing = open.args.closing;
        }
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
