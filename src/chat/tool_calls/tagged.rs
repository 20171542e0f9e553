//! The formats of one call per `<tool_call>` block: Hermes's JSON object,
//! Qwen3-Coder's `<function=NAME>` XML and GLM's `<arg_key>` pairs.

use serde_json::{Map, Value};

use super::partial::{held, ArgsSoFar, Open};
use super::{json_call, param_value, string_typed, ToolCall};

/// `{"name": "...", "arguments": {...}}` (arguments may also be a JSON text,
/// or missing: `{}`).
pub(super) fn hermes_call(block: &str) -> Option<ToolCall> {
    json_call(&serde_json::from_str(block.trim()).ok()?)
}

/// `<function=NAME>` with `<parameter=K>V</parameter>` blocks.
pub(super) fn xml_call(block: &str, tools: Option<&Value>) -> Option<ToolCall> {
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
pub(super) fn glm_call(block: &str, tools: Option<&Value>) -> Option<ToolCall> {
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
pub(super) fn xml_open(block: &str, tools: Option<&Value>) -> Option<Open> {
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
pub(super) fn glm_open(block: &str, tools: Option<&Value>) -> Option<Open> {
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

/// A function name: trimmed, not empty, no markup or spaces in it.
pub(super) fn plain_name(name: &str) -> Option<&str> {
    let name = name.trim();
    let bad = |c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"' | '{' | '}');
    (!name.is_empty() && !name.contains(bad)).then_some(name)
}
