//! MiniMax-M2's and DeepSeek V3.2's invokes: `<{P}invoke name="NAME">` with
//! `<{P}parameter name="K"[ string="true|false"]>V</{P}parameter>` inside,
//! `P` empty for MiniMax and `｜DSML｜` for DeepSeek.

use serde_json::{Map, Value};

use super::{param_value, tagged::plain_name, ToolCall};

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
        let value = match attrs.trim() {
            "string=\"true\"" => Value::String(value.into()),
            "string=\"false\"" => serde_json::from_str(value.trim()).ok()?,
            "" => param_value(tools, name, key, value.trim()),
            _ => return None,
        };
        args.insert(key.into(), value);
        rest = p.trim_start();
    }
    Some(ToolCall::new(name, Value::Object(args).to_string()))
}
