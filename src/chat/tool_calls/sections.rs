//! The formats of a section of calls framed by special tokens: DeepSeek
//! V3/V3.1/R1 and Kimi-K2. Each call's arguments are a JSON object.

use serde_json::Value;

use super::call::{json_args, ToolCall};
use super::gbnf;
use super::partial::{json_args_so_far, Open};
use super::syntax::{Frame, Syntax};
use crate::llama::grammar::GrammarError;

/// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}..`.
pub(crate) struct DeepSeek;

impl Syntax for DeepSeek {
    fn name(&self) -> &'static str {
        "deepseek"
    }

    fn frame(&self) -> Option<Frame> {
        let (open, close) = DS_SECTION;
        Some(Frame {
            open,
            close: Some(close),
        })
    }

    fn special_text(&self, tools_offered: bool) -> bool {
        tools_offered
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        deepseek(block)
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        deepseek_open(block)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        DS_SECTION
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let head = format!("{DS_BEGIN}{name}{DS_SEP}");
        gbnf::json_call(&head, DS_END, prefix, params, rules)
    }
}

/// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:N..`.
pub(crate) struct Kimi;

impl Syntax for Kimi {
    fn name(&self) -> &'static str {
        "kimi"
    }

    fn frame(&self) -> Option<Frame> {
        let (open, close) = KIMI_SECTION;
        Some(Frame {
            open,
            close: Some(close),
        })
    }

    fn special_text(&self, tools_offered: bool) -> bool {
        tools_offered
    }

    fn calls(&self, block: &str, _tools: Option<&Value>) -> Option<Vec<ToolCall>> {
        kimi(block)
    }

    fn open_calls(&self, block: &str, _tools: Option<&Value>) -> Vec<Open> {
        kimi_open(block)
    }

    fn forced_block(&self) -> (&'static str, &'static str) {
        KIMI_SECTION
    }

    fn call_rule(
        &self,
        prefix: &str,
        name: &str,
        params: &Value,
        rules: &mut Vec<String>,
    ) -> Result<String, GrammarError> {
        let head = format!("{KIMI_BEGIN}functions.{name}:0{KIMI_ARGS}");
        gbnf::json_call(&head, KIMI_END, prefix, params, rules)
    }
}

const DS_SECTION: (&str, &str) = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
const KIMI_SECTION: (&str, &str) = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>");

const DS_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_END: &str = "<｜tool▁call▁end｜>";

const KIMI_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_END: &str = "<|tool_call_end|>";

/// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}<｜tool▁call▁end｜>` calls, or
/// R1's `function<｜tool▁sep｜>NAME\n```json\n{args}\n```` inside the same markers.
fn deepseek(block: &str) -> Option<Vec<ToolCall>> {
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

/// DeepSeek's calls so far: a call's name once its separator came (R1's,
/// once its ```json fence opened).
fn deepseek_open(block: &str) -> Vec<Open> {
    each_open(block, DS_BEGIN, DS_END, deepseek, |call| {
        let (head, tail) = call.split_once(DS_SEP)?;
        if tail.trim_start().starts_with('{') {
            return open(head, tail);
        }
        let (name, args) = tail.split_once("```json")?;
        (head.trim() == "function").then_some(())?;
        open(name, args)
    })
}

/// Kimi's calls so far: a call's name once its arguments began.
fn kimi_open(block: &str) -> Vec<Open> {
    each_open(block, KIMI_BEGIN, KIMI_END, kimi, |call| {
        let (id, args) = call.split_once(KIMI_ARGS)?;
        open(kimi_name(id), args)
    })
}

/// A call named `name` (as [`json_args`] takes it) whose arguments so far
/// are the raw JSON `args`.
fn open(name: &str, args: &str) -> Option<Open> {
    let name = name.trim();
    (!name.is_empty() && !name.contains(char::is_whitespace))
        .then(|| Open::new(name, json_args_so_far(args)))
}

/// The whole calls of a block so far (each read back by `whole`), then the
/// one being written (read by `open_one`).
fn each_open(
    block: &str,
    begin: &str,
    end: &str,
    whole: fn(&str) -> Option<Vec<ToolCall>>,
    open_one: impl Fn(&str) -> Option<Open>,
) -> Vec<Open> {
    let mut out = Vec::new();
    let mut rest = block.trim_start();
    while let Some(call) = rest.strip_prefix(begin) {
        let Some((body, p)) = call.split_once(end) else {
            out.extend(open_one(call));
            break;
        };
        let Some(c) = whole(&rest[..begin.len() + body.len() + end.len()]) else {
            break;
        };
        out.extend(c.iter().map(Open::whole));
        rest = p.trim_start();
    }
    out
}

/// `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{args}<|tool_call_end|>` calls.
fn kimi(block: &str) -> Option<Vec<ToolCall>> {
    each(block, KIMI_BEGIN, KIMI_END, |call| {
        let (id, args) = call.split_once(KIMI_ARGS)?;
        json_args(kimi_name(id), args)
    })
}

/// The function's name in Kimi's call id `functions.NAME:N`.
fn kimi_name(id: &str) -> &str {
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    match id.rsplit_once(':') {
        Some((name, n)) if n.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    }
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
