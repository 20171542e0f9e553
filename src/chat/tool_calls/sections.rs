//! The formats of a section of calls framed by special tokens: DeepSeek
//! V3/V3.1/R1 and Kimi-K2. Each call's arguments are a JSON object.

use super::{json_args, ToolCall};

const DS_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_END: &str = "<｜tool▁call▁end｜>";

const KIMI_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_END: &str = "<|tool_call_end|>";

/// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>` calls, or
/// R1's `function<｜tool▁sep｜>NAME\n```json\n{args}\n```` inside the same markers.
pub(super) fn deepseek(block: &str) -> Option<Vec<ToolCall>> {
    each(block, DS_BEGIN, DS_END, |call| {
        let (head, tail) = call.split_once(DS_SEP)?;
        match tail.split_once("```json") {
            Some((name, args)) if head.trim() == "function" => {
                json_args(name, args.trim_end().strip_suffix("```")?)
            }
            _ => json_args(head, tail),
        }
    })
}

/// `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{args}<|tool_call_end|>` calls.
pub(super) fn kimi(block: &str) -> Option<Vec<ToolCall>> {
    each(block, KIMI_BEGIN, KIMI_END, |call| {
        let (id, args) = call.split_once(KIMI_ARGS)?;
        let id = id.trim();
        let id = id.strip_prefix("functions.").unwrap_or(id);
        let name = match id.rsplit_once(':') {
            Some((name, n)) if n.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => id,
        };
        json_args(name, args)
    })
}

/// Every `begin ... end` call in `block` (only whitespace between them).
fn each(
    block: &str,
    begin: &str,
    end: &str,
    call: impl Fn(&str) -> Option<ToolCall>,
) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = block.trim();
    while !rest.is_empty() {
        let (body, p) = rest.strip_prefix(begin)?.split_once(end)?;
        calls.push(call(body)?);
        rest = p.trim_start();
    }
    Some(calls)
}
