//! The JSON-list formats: Nemotron Nano v2's `<TOOLCALL>[...]</TOOLCALL>`
//! and Mistral's `[TOOL_CALLS]`, which runs to the end of the reply and holds
//! a JSON list of calls (Small 3.1) or `NAME[CALL_ID]id[ARGS]{args}` calls
//! (Small 3.2, each after its own `[TOOL_CALLS]`).

use serde_json::Value;

use super::call::{json_args, json_call, ToolCall};
use super::gbnf;
use super::partial::{self, json_args_so_far, whole_args, Open};
use super::syntax::{Frame, Syntax};
use crate::llama::grammar::GrammarError;

/// `<TOOLCALL>[{"name": .., "arguments": {..}}]</TOOLCALL>`.
pub(crate) struct JsonList;

impl Syntax for JsonList {
    fn name(&self) -> &'static str {
        "json-list"
    }

    fn frame(&self) -> Option<Frame> {
        Some(Frame {
            open: "<TOOLCALL>",
            close: Some("</TOOLCALL>"),
        })
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        json_list(block)
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        partial::list(block)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        ("<TOOLCALL>[", "]</TOOLCALL>")
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

/// `[TOOL_CALLS][{..}]` or `[TOOL_CALLS]NAME[ARGS]{..}`.
pub(crate) struct Mistral;

impl Syntax for Mistral {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn frame(&self) -> Option<Frame> {
        Some(Frame {
            open: MARK,
            close: None,
        })
    }

    fn special_text(&self, tools_offered: bool) -> bool {
        tools_offered
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        calls(block)
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        open_calls(block)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        ("[TOOL_CALLS][", "]")
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

const MARK: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// `[{"name": .., "arguments": {..}}, ...]` (a lone object too).
fn json_list(block: &str) -> Option<Vec<ToolCall>> {
    match serde_json::from_str::<Value>(block.trim()).ok()? {
        Value::Array(items) => items.iter().map(json_call).collect(),
        o @ Value::Object(_) => Some(vec![json_call(&o)?]),
        _ => None,
    }
}

/// What follows the first `[TOOL_CALLS]`: segments split at the others.
fn calls(block: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for segment in block.split(MARK) {
        let segment = segment.trim();
        if segment.starts_with('[') {
            calls.extend(json_list(segment)?);
        } else {
            calls.extend(named(segment)?);
        }
    }
    Some(calls)
}

/// `NAME[ARGS]{..}` calls, one after another.
fn named(segment: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = segment;
    while !rest.is_empty() {
        let (head, after) = rest.split_once(ARGS)?;
        let name = head.split_once(CALL_ID).map_or(head, |(n, _)| n);
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        values.next()?.ok()?;
        let end = values.byte_offset();
        calls.push(json_args(name, &after[..end])?);
        rest = after[end..].trim_start();
    }
    Some(calls)
}

/// The calls after `[TOOL_CALLS]` so far: a list's items, or a named call's
/// name once its `[ARGS]` came.
fn open_calls(block: &str) -> Vec<Open> {
    let mut out = Vec::new();
    for segment in block.split(MARK) {
        let segment = segment.trim_start();
        if segment.starts_with('[') {
            out.extend(partial::list(segment));
            continue;
        }
        let mut rest = segment;
        while let Some((head, after)) = rest.split_once(ARGS) {
            let name = head.split_once(CALL_ID).map_or(head, |(n, _)| n).trim();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return out;
            }
            let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            match values.next() {
                Some(Ok(v)) if values.byte_offset() < after.len() => {
                    out.push(Open::new(name, whole_args(&v)));
                    rest = after[values.byte_offset()..].trim_start();
                }
                _ => {
                    out.push(Open::new(name, json_args_so_far(after)));
                    return out;
                }
            }
        }
    }
    out
}
