//! What a tool-call format is, as one trait: how a reply marks its calls
//! (the frame around a block of calls), the calls of a whole block, the
//! calls of a block still being written (streaming), and the grammar pieces
//! that force a call in it. Each family's file implements it; the table in
//! `formats.rs` names each format and says which one a template writes.
//!
//! A leaf: it names only the other leaves (`call.rs`, `partial.rs`).

use serde_json::Value;

use super::call::{Parsed, ToolCall};
use super::partial::Open;
use crate::llama::grammar::GrammarError;

/// The markers around a format's block of calls; `close: None`: the block
/// runs to the end of the reply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    pub(crate) open: &'static str,
    pub(crate) close: Option<&'static str>,
}

/// One tool-call format. The defaults are a framed format's: a reply's
/// calls are in blocks between the [`Frame`]'s markers.
pub(crate) trait Syntax: Sync {
    /// A short name for notes and logs.
    fn name(&self) -> &'static str;

    /// Whether replies are read for calls at all (false: all text).
    fn reads_calls(&self) -> bool {
        true
    }

    /// The markers around a block of calls (None: not framed).
    fn frame(&self) -> Option<Frame> {
        None
    }

    /// Whether the reply must be detokenized with its special tokens as
    /// text for its calls to be seen (markers that are control tokens of
    /// the model: some formats always, others when tools were offered).
    fn special_text(&self, _tools_offered: bool) -> bool {
        false
    }

    /// The calls in one block (the text between the frame's markers), or
    /// `None` when it does not parse.
    fn calls(&self, _block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        None
    }

    /// A whole reply split into its content and calls.
    fn parse(&self, text: &str, tools: Option<&Value>) -> Parsed {
        match self.frame() {
            Some(frame) => framed(frame, text, |block| self.calls(block, tools)),
            None => Parsed {
                content: text.to_string(),
                ..Parsed::default()
            },
        }
    }

    /// The calls of a block so far (the text after its opening marker, its
    /// closing marker not yet come), in order, while their names are known.
    fn open_calls(&self, _block: &str, _tools: Option<&Value>) -> Vec<Open> {
        Vec::new()
    }

    /// A format whose calls are not in framed blocks (harmony's messages):
    /// the reply so far split, an open message held back. `None`: framed.
    fn split_so_far(&self, _text: &str) -> Option<Parsed> {
        None
    }

    /// Such a format's call being written at the end of the reply so far:
    /// where its message starts, and the call so far.
    fn open_call(&self, _text: &str) -> Option<(usize, Open)> {
        None
    }

    /// The text around the one call of a reply a grammar forces.
    fn forced_block(&self) -> (&'static str, &'static str);

    /// Where a call opens, the literal text that wakes a lazy grammar.
    fn trigger(&self) -> &'static str {
        self.forced_block().0
    }

    /// One call to `name` with `params` (its JSON schema) as a GBNF
    /// expression; rules it needs are pushed to `rules`, named from `prefix`.
    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError>;
}

/// Each block between `frame`'s markers whose calls parse gives its calls;
/// any other text (a bad or unclosed block included) is content.
pub(crate) fn framed(
    frame: Frame,
    text: &str,
    block_calls: impl Fn(&str) -> Option<Vec<ToolCall>>,
) -> Parsed {
    let mut out = Parsed::default();
    let mut rest = text;
    while let Some(at) = rest.find(frame.open) {
        out.content.push_str(&rest[..at]);
        let after = &rest[at + frame.open.len()..];
        let (block, next) = match frame.close {
            None => (after, ""),
            Some(close) => match after.find(close) {
                Some(end) => (&after[..end], &after[end + close.len()..]),
                None => {
                    out.content.push_str(&rest[at..]);
                    rest = "";
                    break;
                }
            },
        };
        match block_calls(block).filter(|c| !c.is_empty()) {
            Some(calls) => out.calls.extend(calls),
            None => out.content.push_str(&rest[at..rest.len() - next.len()]),
        }
        rest = next;
    }
    out.content.push_str(rest);
    if !out.calls.is_empty() {
        out.content.truncate(out.content.trim_end().len());
    }
    out
}
