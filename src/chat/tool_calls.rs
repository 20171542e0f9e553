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
//! Each format is one implementation of one trait (`syntax.rs`: the markers
//! around its calls, the parse of a whole block, the calls of a block still
//! being written, the grammar pieces that force a call), in its family's
//! file; `formats.rs` holds the one table naming each format, the markers
//! a template's source holds when it writes that format, and its
//! implementation. The format files share only leaves (`call.rs`: the call
//! and value helpers; `partial.rs`: calls so far; `markers.rs`; `gbnf.rs`:
//! grammar pieces) and never name each other.
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

mod call;
mod formats;
pub(crate) mod gbnf;
mod harmony;
mod invoke;
mod markers;
mod mistral;
mod partial;
mod pythonic;
mod sections;
mod stream;
mod syntax;
mod tagged;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_families;
#[cfg(test)]
mod tests_live;

use serde_json::Value;

pub use call::{call_id, Parsed, ToolCall};
pub use formats::CallFormat;
pub(crate) use markers::partial_marker;
pub use stream::{CallPart, CallStream};

#[cfg(test)]
pub(crate) use harmony::OPEN as HARMONY_OPEN;
#[cfg(test)]
use tagged::OPEN;

/// `text` split into content and calls, the format's way.
pub fn parse(format: CallFormat, text: &str) -> Parsed {
    parse_with_tools(format, text, None)
}

/// As [`parse`], with the request's `tools` (OpenAI's array) telling which
/// XML parameters are strings.
pub fn parse_with_tools(format: CallFormat, text: &str, tools: Option<&Value>) -> Parsed {
    format.syntax().parse(text, tools)
}
