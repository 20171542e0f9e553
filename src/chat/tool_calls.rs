//! Tool calls in a model's reply: which way a chat template asks the model to
//! write them ([`CallFormat::detect`], from the template's source), and the
//! reply split into its plain text and its calls ([`parse`]). Pure text
//! work, no llama.cpp, so any endpoint can use it:
//!
//! ```
//! use bmoe::chat::tool_calls::{parse, CallFormat};
//! let reply = "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
//! let p = parse(CallFormat::Hermes, reply);
//! assert_eq!(p.content, "Let me look.");
//! assert_eq!(p.calls[0].name, "get_weather");
//! assert_eq!(p.calls[0].arguments, r#"{"city":"Paris"}"#);
//! ```
//!
//! The formats:
//! - [`CallFormat::Hermes`] (Qwen3, and bmoe's own tool prompt for templates
//!   that take no tools): `<tool_call>{"name", "arguments"}</tool_call>`.
//! - [`CallFormat::XmlFunction`] (Qwen3-Coder, Qwen3.5, Nemotron 3):
//!   `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`;
//!   a value is JSON when it reads as JSON and the tool's schema does not
//!   call the parameter a string ([`parse_with_tools`]), else text.
//! - [`CallFormat::Harmony`] (gpt-oss): messages framed by `<|channel|>`,
//!   `<|message|>`, `<|end|>`; the `final` channel (and `commentary`
//!   without a recipient) is the content, `analysis` is the reasoning (kept
//!   out of the content), a message to `functions.NAME` is a call.
//! - [`CallFormat::None`]: every other template; the reply is all text.
//!
//! A call that does not parse (bad JSON, an unclosed tag, an unknown shape)
//! stays in the content as the text the model wrote: parsing never fails.
//! [`CallStream`] does the same on a reply as it streams, holding back text
//! that could be the start of a call.

mod harmony;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

pub use stream::CallStream;

/// How a template asks the model to write tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallFormat {
    /// Calls are not parsed: the reply is text.
    #[default]
    None,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
    Hermes,
    /// `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.
    XmlFunction,
    /// gpt-oss's harmony channels, calls addressed `to=functions.NAME`.
    Harmony,
}

/// Where a call opens in the Hermes and XML formats.
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl CallFormat {
    /// The format a chat template's Jinja source writes calls in.
    pub fn detect(source: &str) -> Self {
        if source.contains("<|channel|>") && source.contains("<|call|>") {
            return Self::Harmony;
        }
        if source.contains(OPEN) && source.contains("<function=") {
            return Self::XmlFunction;
        }
        if source.contains(OPEN) && !source.contains("<arg_key>") {
            return Self::Hermes;
        }
        Self::None
    }

    /// A short name for notes and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hermes => "hermes",
            Self::XmlFunction => "xml-function",
            Self::Harmony => "harmony",
        }
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 hex digits, unique within the process.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A reply split up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The text outside the calls (trimmed at its end when there are calls).
    pub content: String,
    /// Harmony's `analysis` channel, when the reply had one.
    pub reasoning: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// `text` split into content and calls, the format's way.
pub fn parse(format: CallFormat, text: &str) -> Parsed {
    parse_with_tools(format, text, None)
}

/// As [`parse`], with the request's `tools` (OpenAI's array) telling which
/// XML parameters are strings.
pub fn parse_with_tools(format: CallFormat, text: &str, tools: Option<&Value>) -> Parsed {
    match format {
        CallFormat::None => Parsed {
            content: text.to_string(),
            ..Parsed::default()
        },
        CallFormat::Hermes | CallFormat::XmlFunction => tagged(format, text, tools),
        CallFormat::Harmony => harmony::parse(text, false),
    }
}

/// The `<tool_call>` formats: each closed block that parses is a call, any
/// other text (a bad block included) is content.
fn tagged(format: CallFormat, text: &str, tools: Option<&Value>) -> Parsed {
    let mut out = Parsed::default();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        out.content.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else {
            out.content.push_str(&rest[at..]);
            rest = "";
            break;
        };
        let block = &after[..end];
        let call = match format {
            CallFormat::XmlFunction => xml_call(block, tools),
            _ => hermes_call(block),
        };
        match call {
            Some(c) => out.calls.push(c),
            None => out
                .content
                .push_str(&rest[at..at + OPEN.len() + end + CLOSE.len()]),
        }
        rest = &after[end + CLOSE.len()..];
    }
    out.content.push_str(rest);
    if !out.calls.is_empty() {
        out.content.truncate(out.content.trim_end().len());
    }
    out
}

/// `{"name": "...", "arguments": {...}}` (arguments may also be a JSON text,
/// or missing: `{}`).
fn hermes_call(block: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(block.trim()).ok()?;
    let name = v.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall::new(name, arguments))
}

/// `<function=NAME>` with `<parameter=K>V</parameter>` blocks.
fn xml_call(block: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let body = block.trim().strip_prefix("<function=")?;
    let (name, body) = body.split_once('>')?;
    let body = body.trim_end().strip_suffix("</function>")?;
    let name = name.trim();
    if name.is_empty() || name.contains('<') {
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let p = rest.strip_prefix("<parameter=")?;
        let (key, p) = p.split_once('>')?;
        let (value, p) = p.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        args.insert(
            key.trim().into(),
            param_value(tools, name, key.trim(), value),
        );
        rest = p.trim_start();
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// A parameter's value: text when the schema says string (or it is not
/// JSON), else the JSON it reads as.
fn param_value(tools: Option<&Value>, function: &str, key: &str, value: &str) -> Value {
    let string_typed = tools
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == function)
        .map(|t| &t["function"]["parameters"]["properties"][key]["type"])
        .is_some_and(|ty| ty == "string");
    if string_typed {
        return Value::String(value.into());
    }
    serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.into()))
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: &str, arguments: String) -> Self {
        Self {
            id: call_id(),
            name: name.into(),
            arguments,
        }
    }
}

/// `call_` and 24 hex digits: the clock and a process-wide counter, mixed.
pub fn call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |mut x: u64| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let a = mix(nanos ^ n.rotate_left(32));
    let b = mix(a ^ n);
    format!("call_{a:016x}{:08x}", b as u32)
}

/// Bytes at the end of `text` that could be the start of `marker` (0 when
/// none): text to hold back until the next piece decides.
pub(crate) fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && text.ends_with(&marker[..k]))
        .unwrap_or(0)
}
