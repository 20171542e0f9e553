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
//! - [`CallFormat::Glm`] (GLM-4.5/4.6/4.7): `<tool_call>NAME<arg_key>K</arg_key>
//!   <arg_value>V</arg_value></tool_call>`, values typed as in the XML format.
//! - [`CallFormat::MiniMax`] (MiniMax-M2): `<minimax:tool_call><invoke
//!   name="NAME"><parameter name="K">V</parameter></invoke></minimax:tool_call>`.
//! - [`CallFormat::Dsml`] (DeepSeek V3.2): the same invokes, each tag opened
//!   by `｜DSML｜`, in a `function_calls` block, a `string` attribute typing values.
//! - [`CallFormat::DeepSeek`] (DeepSeek V3/V3.1 and R1): `<｜tool▁calls▁begin｜>`
//!   `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>`... (R1:
//!   `function<｜tool▁sep｜>NAME` and the arguments in a fenced json block).
//! - [`CallFormat::Kimi`] (Kimi-K2): `<|tool_calls_section_begin|>`
//!   `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{args}<|tool_call_end|>`...
//! - [`CallFormat::JsonList`] (Nemotron Nano v2): `<TOOLCALL>[{"name", "arguments"}, ...]</TOOLCALL>`.
//! - [`CallFormat::Mistral`]: `[TOOL_CALLS]` then a JSON list of calls
//!   (Mistral Small 3.1) or `NAME[ARGS]{args}` (3.2, `[CALL_ID]id` allowed), to the end.
//! - [`CallFormat::Pythonic`] (LFM2): `<|tool_call_start|>[f(a='x', b=1)]<|tool_call_end|>`.
//! - [`CallFormat::None`]: every other template; the reply is all text.
//!
//! Why not llama.cpp's own chat parser (common/chat.cpp, linked already
//! through llama-cpp-sys-2's `common`): it derives each family's parser by
//! rendering the template in llama.cpp's own Jinja engine in this process,
//! outside the sandboxed renderer every template goes through here, behind a
//! C++-only API (a shim of our own); driven on the same recorded replies as
//! the tests here (benches/chat_parser/run.sh) it splits 11 of the 16
//! families and throws on the rest, at 3-6x these parsers' time a reply.
//!
//! A call that does not parse (bad JSON, an unclosed tag, an unknown shape)
//! stays in the content as the text the model wrote: parsing never fails.
//! [`CallStream`] does the same on a reply as it streams, holding back text
//! that could be the start of a call and handing out each call as soon as
//! its block closes (the whole parse's calls, in order, with the same ids).

mod harmony;
mod invoke;
mod mistral;
mod partial;
mod pythonic;
mod sections;
mod stream;
mod tagged;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_families;
#[cfg(test)]
mod tests_live;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

pub use stream::{CallPart, CallStream};

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
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
    Glm,
    /// `<minimax:tool_call><invoke name=..><parameter name=..>V</parameter></invoke>..`.
    MiniMax,
    /// `<｜DSML｜function_calls><｜DSML｜invoke name=..>..`.
    Dsml,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}..`.
    DeepSeek,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:N..`.
    Kimi,
    /// `<TOOLCALL>[{"name": .., "arguments": {..}}]</TOOLCALL>`.
    JsonList,
    /// `[TOOL_CALLS][{..}]` or `[TOOL_CALLS]NAME[ARGS]{..}`.
    Mistral,
    /// `<|tool_call_start|>[f(a='x')]<|tool_call_end|>`.
    Pythonic,
}

/// Where a call opens in the Hermes, XML and GLM formats.
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The markers around a format's block of calls; `close: None`: the block
/// runs to the end of the reply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    pub(crate) open: &'static str,
    pub(crate) close: Option<&'static str>,
}

impl CallFormat {
    /// The format a chat template's Jinja source writes calls in.
    pub fn detect(source: &str) -> Self {
        let has = |m: &str| source.contains(m);
        if has("<|channel|>") && has("<|call|>") {
            return Self::Harmony;
        }
        let rules: [(bool, Self); 11] = [
            (has("<|tool_calls_section_begin|>"), Self::Kimi),
            (has("tool▁calls▁begin"), Self::DeepSeek),
            (has("DSML") && has("function_calls"), Self::Dsml),
            (has("<minimax:tool_call>"), Self::MiniMax),
            (has(OPEN) && has("<arg_key>"), Self::Glm),
            (has(OPEN) && has("<function="), Self::XmlFunction),
            (has(OPEN), Self::Hermes),
            (has("<TOOLCALL>"), Self::JsonList),
            (has("[TOOL_CALLS]"), Self::Mistral),
            (has("<|tool_call_start|>"), Self::Pythonic),
            (true, Self::None),
        ];
        rules
            .into_iter()
            .find_map(|(hit, f)| hit.then_some(f))
            .unwrap_or_default()
    }

    /// The markers around a block of calls (none for harmony and `None`).
    pub(crate) fn frame(self) -> Option<Frame> {
        let (open, close) = match self {
            Self::None | Self::Harmony => return None,
            Self::Hermes | Self::XmlFunction | Self::Glm => (OPEN, Some(CLOSE)),
            Self::MiniMax => ("<minimax:tool_call>", Some("</minimax:tool_call>")),
            Self::Dsml => (
                "<｜DSML｜function_calls>",
                Some("</｜DSML｜function_calls>"),
            ),
            Self::DeepSeek => ("<｜tool▁calls▁begin｜>", Some("<｜tool▁calls▁end｜>")),
            Self::Kimi => (
                "<|tool_calls_section_begin|>",
                Some("<|tool_calls_section_end|>"),
            ),
            Self::JsonList => ("<TOOLCALL>", Some("</TOOLCALL>")),
            Self::Mistral => ("[TOOL_CALLS]", None),
            Self::Pythonic => ("<|tool_call_start|>", Some("<|tool_call_end|>")),
        };
        Some(Frame { open, close })
    }

    /// Whether the reply must be detokenized with its special tokens as
    /// text for its calls to be seen: the formats whose markers are control
    /// tokens of their models (harmony always, the others when the request
    /// offered tools).
    pub fn special_text(self, tools_offered: bool) -> bool {
        match self {
            Self::Harmony => true,
            Self::DeepSeek | Self::Kimi | Self::Mistral | Self::Pythonic => tools_offered,
            _ => false,
        }
    }

    /// A short name for notes and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hermes => "hermes",
            Self::XmlFunction => "xml-function",
            Self::Harmony => "harmony",
            Self::Glm => "glm",
            Self::MiniMax => "minimax",
            Self::Dsml => "deepseek-dsml",
            Self::DeepSeek => "deepseek",
            Self::Kimi => "kimi",
            Self::JsonList => "json-list",
            Self::Mistral => "mistral",
            Self::Pythonic => "pythonic",
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
    /// The reply ended inside its last call (streamed under a call grammar,
    /// which sent it as it was written): that call holds the arguments it
    /// had, closed.
    pub cut: bool,
}

/// `text` split into content and calls, the format's way.
pub fn parse(format: CallFormat, text: &str) -> Parsed {
    parse_with_tools(format, text, None)
}

/// As [`parse`], with the request's `tools` (OpenAI's array) telling which
/// XML parameters are strings.
pub fn parse_with_tools(format: CallFormat, text: &str, tools: Option<&Value>) -> Parsed {
    match (format, format.frame()) {
        (CallFormat::Harmony, _) => harmony::parse(text, false),
        (_, Some(frame)) => framed(frame, text, |block| calls_in(format, block, tools)),
        (_, None) => Parsed {
            content: text.to_string(),
            ..Parsed::default()
        },
    }
}

/// The calls in one block (the text between a frame's markers), or `None`
/// when it does not parse in `format`.
fn calls_in(format: CallFormat, block: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
    let one = |c: Option<ToolCall>| c.map(|c| vec![c]);
    match format {
        CallFormat::Hermes => one(tagged::hermes_call(block)),
        CallFormat::XmlFunction => one(tagged::xml_call(block, tools)),
        CallFormat::Glm => one(tagged::glm_call(block, tools)),
        CallFormat::MiniMax => invoke::calls(block, "", tools),
        CallFormat::Dsml => invoke::calls(block, "｜DSML｜", tools),
        CallFormat::DeepSeek => sections::deepseek(block),
        CallFormat::Kimi => sections::kimi(block),
        CallFormat::JsonList => mistral::json_list(block),
        CallFormat::Mistral => mistral::calls(block),
        CallFormat::Pythonic => pythonic::calls(block),
        CallFormat::None | CallFormat::Harmony => None,
    }
}

/// Each block between `frame`'s markers whose calls parse gives its calls;
/// any other text (a bad or unclosed block included) is content.
fn framed(frame: Frame, text: &str, block_calls: impl Fn(&str) -> Option<Vec<ToolCall>>) -> Parsed {
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

/// A parameter's value: text when the schema says string (or it is not
/// JSON), else the JSON it reads as.
pub(crate) fn param_value(tools: Option<&Value>, function: &str, key: &str, value: &str) -> Value {
    if string_typed(tools, function, key) {
        return Value::String(value.into());
    }
    serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.into()))
}

/// Whether the request's tool `function` calls its parameter `key` a string.
pub(crate) fn string_typed(tools: Option<&Value>, function: &str, key: &str) -> bool {
    tools
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == function)
        .map(|t| &t["function"]["parameters"]["properties"][key]["type"])
        .is_some_and(|ty| ty == "string")
}

/// A call's arguments given as a JSON text: a call when they are an object
/// (written compactly), else `None`.
pub(crate) fn json_args(name: &str, args: &str) -> Option<ToolCall> {
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    match serde_json::from_str::<Value>(args.trim()).ok()? {
        v @ Value::Object(_) => Some(ToolCall::new(name, v.to_string())),
        _ => None,
    }
}

/// A call named `name` with `arguments` an object (a JSON text or missing:
/// `{}`), as the JSON-shaped formats write it.
pub(crate) fn json_call(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s).ok()? {
            o @ Value::Object(_) => o.to_string(),
            _ => return None,
        },
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall::new(name, arguments))
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
        .find(|&k| {
            // Markers are not all ASCII (DeepSeek's `｜`, `▁`): both cuts on
            // char boundaries.
            marker.is_char_boundary(k)
                && text.is_char_boundary(text.len() - k)
                && text.ends_with(&marker[..k])
        })
        .unwrap_or(0)
}
