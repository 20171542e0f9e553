//! MiniMax-M2's and DeepSeek V3.2's invokes: `<{P}invoke name="NAME">` with
//! `<{P}parameter name="K"[ string="true|false"]>V</{P}parameter>` inside,
//! `P` empty for MiniMax and `｜DSML｜` for DeepSeek.

use serde_json::{Map, Value};

use super::partial::{held, ArgsSoFar, Open};
use super::{param_value, string_typed, tagged::plain_name, ToolCall};

/// Every invoke in a block (nothing else but whitespace between them).
pub(super) fn calls(block: &str, prefix: &str, tools: Option<&Value>) -> Option<Vec<ToolCall>> {
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
pub(super) fn open_calls(block: &str, prefix: &str, tools: Option<&Value>) -> Vec<Open> {
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
