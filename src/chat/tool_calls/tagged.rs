//! The formats of one call per `<tool_call>` block: Hermes's JSON object,
//! Qwen3-Coder's `<function=NAME>` XML and GLM's `<arg_key>` pairs; and the
//! plain format of a template that takes no tools, whose replies are text
//! and whose forced calls are Hermes's (bmoe's own tool prompt asks for them).

use serde_json::{Map, Value};

use super::call::{json_call, param_value, plain_name, string_typed, ToolCall};
use super::gbnf::{self, Apart};
use super::markers::held;
use super::partial::{self, ArgsSoFar, Open};
use super::syntax::{Frame, Syntax};
use crate::llama::grammar::GrammarError;

/// Where a call opens in the Hermes, XML and GLM formats.
pub(crate) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FRAME: Frame = Frame {
    open: OPEN,
    close: Some(CLOSE),
};
/// The block around a forced Hermes or XML call.
const FORCED: (&str, &str) = ("<tool_call>\n", "\n</tool_call>");

/// No calls are parsed: the reply is text (a grammar forces Hermes's).
pub(crate) struct Plain;

impl Syntax for Plain {
    fn name(&self) -> &'static str {
        "none"
    }

    fn reads_calls(&self) -> bool {
        false
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        Hermes.forced_block()
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        Hermes.call_rule(prefix, name, params, rules)
    }
}

/// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
pub(crate) struct Hermes;

impl Syntax for Hermes {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn frame(&self) -> Option<Frame> {
        Some(FRAME)
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        hermes_call(block).map(|c| vec![c])
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        partial::hermes(block).into_iter().collect()
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        FORCED
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        gbnf::name_and_arguments(prefix, name, params, rules)
    }
}

/// `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.
pub(crate) struct XmlFunction;

impl Syntax for XmlFunction {
    fn name(&self) -> &'static str {
        "xml-function"
    }

    fn frame(&self) -> Option<Frame> {
        Some(FRAME)
    }

    fn calls(&self, block: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        xml_call(block, tools).map(|c| vec![c])
    }

    fn open_calls(&self, block: &str, tools: Option<&Value>) -> Vec<Open> {
        xml_open(block, tools).into_iter().collect()
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        FORCED
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let apart = Apart {
            head: format!("<function={name}>\n"),
            tail: "</function>",
            sep: None,
            strings_as_text: true,
        };
        apart.rule(prefix, params, rules, |key, _| {
            (format!("<parameter={key}>\n"), "\n</parameter>\n")
        })
    }
}

/// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
pub(crate) struct Glm;

impl Syntax for Glm {
    fn name(&self) -> &'static str {
        "glm"
    }

    fn frame(&self) -> Option<Frame> {
        Some(FRAME)
    }

    fn calls(&self, block: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        glm_call(block, tools).map(|c| vec![c])
    }

    fn open_calls(&self, block: &str, tools: Option<&Value>) -> Vec<Open> {
        glm_open(block, tools).into_iter().collect()
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        (OPEN, CLOSE)
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let apart = Apart {
            head: format!("{name}\n"),
            tail: "",
            sep: None,
            strings_as_text: true,
        };
        apart.rule(prefix, params, rules, |key, _| {
            (
                format!("<arg_key>{key}</arg_key>\n<arg_value>"),
                "</arg_value>\n",
            )
        })
    }
}

/// `{"name": "...", "arguments": {...}}` (arguments may also be a JSON text,
/// or missing: `{}`).
fn hermes_call(block: &str) -> Option<ToolCall> {
    json_call(&serde_json::from_str(block.trim()).ok()?)
}

/// `<function=NAME>` with `<parameter=K>V</parameter>` blocks.
fn xml_call(block: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let body = block.trim().strip_prefix("<function=")?;
    let (name, body) = body.split_once('>')?;
    let body = body.trim_end().strip_suffix("</function>")?;
    let name = plain_name(name)?;
    let mut args = Map::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let p = rest.strip_prefix("<parameter=")?;
        let (key, p) = p.split_once('>')?;
        let (value, p) = p.split_once("</parameter>")?;
        if value.contains("<parameter=") {
            return None;
        }
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

/// `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs
/// (whitespace between them allowed).
fn glm_call(block: &str, tools: Option<&Value>) -> Option<ToolCall> {
    let block = block.trim();
    let (name, mut rest) = match block.find("<arg_key>") {
        Some(at) => (&block[..at], &block[at..]),
        None => (block, ""),
    };
    let name = plain_name(name)?;
    let mut args = Map::new();
    while !rest.is_empty() {
        let p = rest.strip_prefix("<arg_key>")?;
        let (key, p) = p.split_once("</arg_key>")?;
        let p = p.trim_start().strip_prefix("<arg_value>")?;
        let (value, p) = p.split_once("</arg_value>")?;
        if value.contains("<arg_key>") {
            return None;
        }
        args.insert(
            key.trim().into(),
            param_value(tools, name, key.trim(), value),
        );
        rest = p.trim_start();
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}

/// An XML call so far: its name once `<function=NAME>` is whole, its whole
/// parameters, and a string-typed one still being written.
fn xml_open(block: &str, tools: Option<&Value>) -> Option<Open> {
    let body = block.trim_start().strip_prefix("<function=")?;
    let (name, body) = body.split_once('>')?;
    let name = plain_name(name)?;
    let mut args = ArgsSoFar::default();
    let mut rest = body.trim_start();
    while let Some(p) = rest.strip_prefix("<parameter=") {
        let Some((key, p)) = p.split_once('>') else {
            break;
        };
        let key = key.trim();
        let Some((value, p)) = p.split_once("</parameter>") else {
            if string_typed(tools, name, key) && !p.is_empty() {
                let value = held(p.strip_prefix('\n').unwrap_or(p), "</parameter>");
                args.open_string(key, value.strip_suffix('\n').unwrap_or(&value));
            }
            break;
        };
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        if !args.member(key, param_value(tools, name, key, value)) {
            break;
        }
        rest = p.trim_start();
    }
    Some(Open::new(name, args.args()))
}

/// A GLM call so far: its name once its first `<arg_key>` came, its whole
/// pairs, and a string-typed value still being written.
fn glm_open(block: &str, tools: Option<&Value>) -> Option<Open> {
    let block = block.trim_start();
    let at = block.find("<arg_key>")?;
    let name = plain_name(&block[..at])?;
    let mut args = ArgsSoFar::default();
    let mut rest = &block[at..];
    while let Some(p) = rest.strip_prefix("<arg_key>") {
        let Some((key, p)) = p.split_once("</arg_key>") else {
            break;
        };
        let key = key.trim();
        let Some(p) = p.trim_start().strip_prefix("<arg_value>") else {
            break;
        };
        let Some((value, p)) = p.split_once("</arg_value>") else {
            if string_typed(tools, name, key) {
                args.open_string(key, &held(p, "</arg_value>"));
            }
            break;
        };
        if !args.member(key, param_value(tools, name, key, value)) {
            break;
        }
        rest = p.trim_start();
    }
    Some(Open::new(name, args.args()))
}
