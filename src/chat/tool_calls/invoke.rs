//! MiniMax-M2's and DeepSeek V3.2's invokes: `<{P}invoke name="NAME">` with
//! `<{P}parameter name="K"[ string="true|false"]>V</{P}parameter>` inside,
//! `P` empty for MiniMax and `｜DSML｜` for DeepSeek.

use serde_json::{Map, Value};

use super::call::{param_value, plain_name, string_typed, ToolCall};
use super::gbnf::Apart;
use super::markers::held;
use super::partial::{ArgsSoFar, Open};
use super::syntax::{Frame, Syntax};
use crate::llama::grammar::GrammarError;

/// A format of invokes: its tags' prefix, its frame, and what it writes
/// around a forced call.
pub(crate) struct Invokes {
    name: &'static str,
    /// What opens each tag inside the frame.
    prefix: &'static str,
    frame: Frame,
    forced: (&'static str, &'static str),
    /// A forced invoke's closing tag.
    invoke_close: &'static str,
    /// A forced parameter's closing tag.
    param_close: &'static str,
    /// Each forced parameter says whether it is text (`string="true"`).
    says_string: bool,
}

/// `<minimax:tool_call><invoke name=..><parameter name=..>V</parameter></invoke>..`.
pub(crate) const MINIMAX: Invokes = Invokes {
    name: "minimax",
    prefix: "",
    frame: Frame {
        open: "<minimax:tool_call>",
        close: Some("</minimax:tool_call>"),
    },
    forced: ("<minimax:tool_call>\n", "\n</minimax:tool_call>"),
    invoke_close: "</invoke>",
    param_close: "</parameter>\n",
    says_string: false,
};

/// `<｜DSML｜function_calls><｜DSML｜invoke name=..>..`.
pub(crate) const DSML: Invokes = Invokes {
    name: "deepseek-dsml",
    prefix: "｜DSML｜",
    frame: Frame {
        open: "<｜DSML｜function_calls>",
        close: Some("</｜DSML｜function_calls>"),
    },
    forced: ("<｜DSML｜function_calls>\n", "\n</｜DSML｜function_calls>"),
    invoke_close: "</｜DSML｜invoke>",
    param_close: "</｜DSML｜parameter>\n",
    says_string: true,
};

impl Syntax for Invokes {
    fn name(&self) -> &'static str {
        self.name
    }

    fn frame(&self) -> Option<Frame> {
        Some(self.frame)
    }

    fn calls(&self, block: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        calls(block, self.prefix, tools)
    }

    fn open_calls(&self, block: &str, tools: Option<&Value>) -> Vec<Open> {
        open_calls(block, self.prefix, tools)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        self.forced
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let apart = Apart {
            head: format!("<{}invoke name=\"{name}\">\n", self.prefix),
            tail: self.invoke_close,
            sep: None,
            strings_as_text: true,
        };
        apart.rule(prefix, params, rules, |key, text| {
            let p = self.prefix;
            let head = if self.says_string {
                format!("<{p}parameter name=\"{key}\" string=\"{text}\">")
            } else {
                format!("<{p}parameter name=\"{key}\">")
            };
            (head, self.param_close)
        })
    }
}

/// Every invoke in a block (nothing else but whitespace between them).
fn calls(block: &str, prefix: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
    let open = format!("<{prefix}invoke name=\"");
    let close = format!("</{prefix}invoke>");
    let mut calls = Vec::new();
    let mut rest = block.trim();
    while !rest.is_empty() {
        let p = rest.strip_prefix(open.as_str())?;
        let (name, p) = p.split_once("\">")?;
        let (body, p) = p.split_once(close.as_str())?;
        calls.push(invoke(plain_name(name)?, body, prefix, tools)?);
        rest = p.trim_start();
    }
    Some(calls)
}

/// One invoke's parameters.
fn invoke(name: &str, body: &str, prefix: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let open = format!("<{prefix}parameter name=\"");
    let close = format!("</{prefix}parameter>");
    let mut args = Map::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let p = rest.strip_prefix(open.as_str())?;
        let (head, p) = p.split_once('>')?;
        let (value, p) = p.split_once(close.as_str())?;
        if value.contains(open.as_str()) {
            return None;
        }
        let (key, attrs) = head.split_once('"')?;
        args.insert(key.into(), param(tools, name, key, attrs, value)?);
        rest = p.trim_start();
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// A parameter's value as its `string` attribute (or, without one, the
/// tool's schema) types it.
fn param(tools: Option<&Value>, name: &str, key: &str, attrs: &str, value: &str) -> Option<Value> {
    match attrs.trim() {
        "string=\"true\"" => Some(Value::String(value.into())),
        "string=\"false\"" => serde_json::from_str(value.trim()).ok(),
        "" => Some(param_value(tools, name, key, value.trim())),
        _ => None,
    }
}

/// The invokes of a block so far: the whole ones, then one whose name is
/// known with its whole parameters and a string one still being written.
fn open_calls(block: &str, prefix: &str, tools: Option<&Value>) -> Vec<Open> {
    let open = format!("<{prefix}invoke name=\"");
    let close = format!("</{prefix}invoke>");
    let mut out = Vec::new();
    let mut rest = block.trim_start();
    while let Some(p) = rest.strip_prefix(open.as_str()) {
        let Some((name, p)) = p.split_once("\">") else {
            break;
        };
        let Some(name) = plain_name(name) else {
            break;
        };
        let Some((body, p)) = p.split_once(close.as_str()) else {
            out.push(Open::new(name, open_params(name, p, prefix, tools).args()));
            break;
        };
        match invoke(name, body, prefix, tools) {
            Some(c) => out.push(Open::whole(&c)),
            None => break,
        }
        rest = p.trim_start();
    }
    out
}

/// An open invoke's parameters so far.
fn open_params(name: &str, body: &str, prefix: &str, tools: Option<&Value>) -> ArgsSoFar {
    let open = format!("<{prefix}parameter name=\"");
    let close = format!("</{prefix}parameter>");
    let mut args = ArgsSoFar::default();
    let mut rest = body.trim_start();
    while let Some(p) = rest.strip_prefix(open.as_str()) {
        let Some((head, p)) = p.split_once('>') else {
            break;
        };
        let Some((key, attrs)) = head.split_once('"') else {
            break;
        };
        let Some((value, p)) = p.split_once(close.as_str()) else {
            match attrs.trim() {
                "string=\"true\"" => args.open_string(key, &held(p, &close)),
                "" if string_typed(tools, name, key) => {
                    let value = held(p.trim_start(), &close);
                    args.open_string(key, value.trim_end());
                }
                _ => {}
            }
            break;
        };
        let Some(v) = param(tools, name, key, attrs, value) else {
            break;
        };
        if !args.member(key, v) {
            break;
        }
        rest = p.trim_start();
    }
    args
}
