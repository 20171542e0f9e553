//! gpt-oss's harmony framing: `<|start|>assistant<|channel|>NAME[ to=R]
//! [<|constrain|>json]<|message|>BODY<|end|>` (or `<|call|>`, `<|return|>`),
//! one message after another. `final` (and `commentary` to no one) is the
//! content, `analysis` the reasoning, a message to `functions.NAME` a call.
//! A reply with no framing at all (its control tokens not rendered as text)
//! is content as it is.

use serde_json::Value;

use super::call::{Parsed, ToolCall};
use super::gbnf;
use super::markers::{held_for_any, partial_marker};
use super::partial::{json_args_so_far, Open};
use super::syntax::Syntax;
use crate::llama::grammar::GrammarError;

/// gpt-oss's harmony channels, calls addressed `to=functions.NAME`: not
/// framed, so it reads a reply message by message.
pub(crate) struct Harmony;

/// Where a harmony call opens.
pub(crate) const OPEN: &str = "<|channel|>commentary to=";

impl Syntax for Harmony {
    fn name(&self) -> &'static str {
        "harmony"
    }

    fn special_text(&self, _tools_offered: bool) -> bool {
        true
    }

    fn parse(&self, text: &str, _tools: Option<&Value>) -> Parsed {
        parse(text, false)
    }

    fn split_so_far(&self, text: &str) -> Option<Parsed> {
        Some(parse(text, true))
    }

    fn open_call(&self, text: &str) -> Option<(usize, Open)> {
        open_call(text)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        ("", "")
    }

    fn trigger(&self) -> &'static str {
        OPEN
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let head = format!("{OPEN}functions.{name} <|constrain|>json<|message|>");
        gbnf::json_call(&head, "<|call|>", prefix, params, rules)
    }
}

const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
/// What ends a message's body.
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];

/// One framed message: its header's channel and recipient, its body, and
/// whether its end marker came.
struct Framed<'a> {
    raw: &'a str,
    channel: &'a str,
    recipient: Option<&'a str>,
    body: &'a str,
    closed: bool,
}

/// Split `text`; `partial`: the reply is still coming, so an open message's
/// possible partial end marker, and an open call, are held back (left out).
fn parse(text: &str, partial: bool) -> Parsed {
    let mut out = Parsed::default();
    let first = [START, CHANNEL, MESSAGE]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .map(|at| if addressed(text) { 0 } else { at });
    let Some(first) = first else {
        let keep = if partial && (addressed(text) || RECIPIENT.starts_with(text.trim_start())) {
            0
        } else if partial {
            text.len() - partial_marker(text, CHANNEL).max(partial_marker(text, START))
        } else {
            text.len()
        };
        out.content = text[..keep].to_string();
        return out;
    };
    out.content.push_str(&text[..first]);
    let mut rest = &text[first..];
    while !rest.is_empty() {
        let Some(m) = next_message(rest) else {
            if !partial {
                out.content.push_str(rest);
            }
            break;
        };
        rest = &rest[m.raw.len()..];
        take(&mut out, &m, partial && rest.is_empty());
    }
    if !out.calls.is_empty() {
        out.content.truncate(out.content.trim_end().len());
    }
    out
}

/// The call being written at the end of a reply still coming: where its
/// message starts, and the call so far (its name from the header, its
/// arguments from the body).
fn open_call(text: &str) -> Option<(usize, Open)> {
    let mut at = match addressed(text) {
        true => 0,
        false => [START, CHANNEL, MESSAGE]
            .iter()
            .filter_map(|m| text.find(m))
            .min()?,
    };
    loop {
        let m = next_message(&text[at..])?;
        if m.closed {
            at += m.raw.len();
            continue;
        }
        return Some((at, Open::new(m.recipient?, json_args_so_far(m.body))));
    }
}

/// What opens a reply whose first message the prompt's
/// `<|start|>assistant` began with a recipient: ` to=functions.NAME<|channel|>..`.
const RECIPIENT: &str = "to=";

/// Whether the reply opens with the recipient of its first message's header.
fn addressed(text: &str) -> bool {
    text.trim_start().starts_with(RECIPIENT)
}

/// The message at the start of `text` (None: its header is not complete).
fn next_message(text: &str) -> Option<Framed<'_>> {
    let m = text.find(MESSAGE)?;
    let header = &text[..m];
    let body_at = m + MESSAGE.len();
    let (body_len, end_len, closed) = ENDS
        .iter()
        .filter_map(|e| text[body_at..].find(e).map(|i| (i, e)))
        .min()
        .map(|(i, e)| (i, if *e == "<|start|>" { 0 } else { e.len() }, true))
        .unwrap_or((text.len() - body_at, 0, false));
    Some(Framed {
        raw: &text[..body_at + body_len + end_len],
        channel: word_after(header, CHANNEL).unwrap_or(""),
        recipient: word_after(header, "to=functions."),
        body: &text[body_at..body_at + body_len],
        closed,
    })
}

/// The word after `key` in a header (up to a space or a `<`).
fn word_after<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(key)? + key.len();
    let w = &header[at..];
    let end = w
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(w.len());
    Some(&w[..end]).filter(|w| !w.is_empty())
}

/// Put one message where it belongs; `open`: the last message of a reply
/// still coming.
fn take(out: &mut Parsed, m: &Framed, open: bool) {
    if let Some(name) = m.recipient {
        if open && !m.closed {
            return;
        }
        let args = m.body.trim();
        match serde_json::from_str::<serde_json::Value>(args) {
            Ok(v) if v.is_object() => out.calls.push(ToolCall::new(name, v.to_string())),
            _ => out.content.push_str(m.raw),
        }
        return;
    }
    let body = if open && !m.closed {
        let hold = held_for_any(m.body, &ENDS);
        &m.body[..m.body.len() - hold]
    } else {
        m.body
    };
    if m.channel == "analysis" {
        out.reasoning.get_or_insert_with(String::new).push_str(body);
    } else {
        out.content.push_str(body);
    }
}
