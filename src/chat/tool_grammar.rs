//! Grammars that hold a reply to a tool call written in the template's own
//! call format ([`CallFormat`]), as its parser ([`super::tool_calls`]) reads
//! it back: the call's markers as literals, the tool's name, and its
//! arguments from the tool's `parameters` schema through llama.cpp's
//! json-schema-to-grammar. `tool_choice` `required` forces one call to any
//! of the tools, a named function that one; under `auto` the same grammar
//! is lazy, woken where the format's call opens ([`trigger`]), so a reply of
//! plain text stays possible.
//!
//! Formats that write each argument apart (the XML ones, GLM, Python-style)
//! write the schema's required parameters, in its order: a string-typed one
//! as text (one of its `enum` when it has one), any other as JSON.

use serde_json::{json, Value};

use super::tool_calls::CallFormat;
use crate::llama::grammar::{regex_escape, schema_to_gbnf, Grammar, GrammarError, ROOT};
use crate::llama::schema_check::{schema_check, RefusalKind, SchemaRefusal};

/// Which calls a request lets or makes the model write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Text or calls, as the model likes (a lazy grammar).
    #[default]
    Auto,
    /// One call to one of the tools.
    Required,
    /// One call to this tool.
    Named(String),
}

/// Why the tools cannot be turned into a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolGrammarError {
    #[error("tools[{index}] ({name}) parameters: {source}")]
    Schema {
        index: usize,
        name: String,
        #[source]
        source: GrammarError,
    },
    #[error("tool_choice names {0:?}, which is not among the request's tools")]
    Unknown(String),
}

impl ToolGrammarError {
    /// Whether a tool's schema is refused even where calls are only let
    /// ([`GrammarError::refused_everywhere`]).
    pub fn refused_everywhere(&self) -> bool {
        matches!(self, Self::Schema { source, .. } if source.refused_everywhere())
    }
}

/// The grammar for `choice` over `tools` (OpenAI's list of functions) in
/// `format` ([`CallFormat::None`] writes Hermes calls, as bmoe's own tool
/// prompt asks).
pub fn call_grammar(
    format: CallFormat,
    tools: &Value,
    choice: &ToolChoice,
) -> Result<Grammar, ToolGrammarError> {
    let format = match format {
        CallFormat::None => CallFormat::Hermes,
        f => f,
    };
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    for (index, t) in tools.as_array().into_iter().flatten().enumerate() {
        let f = &t["function"];
        let name = f["name"].as_str().unwrap_or_default();
        if matches!(choice, ToolChoice::Named(n) if n != name) {
            continue;
        }
        let params = f
            .get("parameters")
            .filter(|p| p.is_object())
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        // Checked whole first: the formats that write arguments apart read
        // the parameters' bounds themselves.
        let call = schema_check(&params)
            .map_err(GrammarError::from)
            .and_then(|()| call_rule(format, &format!("t{index}"), name, &params, &mut rules));
        calls.push(call.map_err(|source| ToolGrammarError::Schema {
            index,
            name: name.into(),
            source,
        })?);
    }
    if calls.is_empty() {
        let name = match choice {
            ToolChoice::Named(n) => n.clone(),
            _ => String::new(),
        };
        return Err(ToolGrammarError::Unknown(name));
    }
    let (open, close) = block(format);
    let root = format!(
        "root ::= {} ( {} ) {}",
        lit(open),
        calls.join(" | "),
        lit(close)
    );
    rules.insert(0, root);
    let triggers = match choice {
        ToolChoice::Auto => vec![trigger(format)],
        _ => Vec::new(),
    };
    Ok(Grammar {
        gbnf: rules.join("\n") + "\n",
        triggers,
    })
}

/// The regular expression that wakes `format`'s lazy grammar: its call's
/// opening marker.
pub fn trigger(format: CallFormat) -> String {
    let (open, _) = block(format);
    let open = if open.is_empty() { HARMONY_OPEN } else { open };
    regex_escape(open)
}

/// Where a harmony call opens.
const HARMONY_OPEN: &str = "<|channel|>commentary to=";

/// The text around the one call of a reply.
fn block(format: CallFormat) -> (&'static str, &'static str) {
    match format {
        CallFormat::None | CallFormat::Hermes | CallFormat::XmlFunction => {
            ("<tool_call>\n", "\n</tool_call>")
        }
        CallFormat::Glm => ("<tool_call>", "</tool_call>"),
        CallFormat::Harmony => ("", ""),
        CallFormat::MiniMax => ("<minimax:tool_call>\n", "\n</minimax:tool_call>"),
        CallFormat::Dsml => ("<｜DSML｜function_calls>\n", "\n</｜DSML｜function_calls>"),
        CallFormat::DeepSeek => ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
        CallFormat::Kimi => ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        CallFormat::JsonList => ("<TOOLCALL>[", "]</TOOLCALL>"),
        CallFormat::Mistral => ("[TOOL_CALLS][", "]"),
        CallFormat::Pythonic => ("<|tool_call_start|>[", "]<|tool_call_end|>"),
    }
}

/// One call to `name` in `format`: its GBNF expression (rules it needs
/// pushed to `rules`, named from `prefix`).
fn call_rule(
    format: CallFormat,
    prefix: &str,
    name: &str,
    params: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let (head, tail) = match format {
        CallFormat::XmlFunction => (format!("<function={name}>\n"), "</function>"),
        CallFormat::Glm => (format!("{name}\n"), ""),
        CallFormat::MiniMax => (format!("<invoke name=\"{name}\">\n"), "</invoke>"),
        CallFormat::Dsml => (
            format!("<｜DSML｜invoke name=\"{name}\">\n"),
            "</｜DSML｜invoke>",
        ),
        CallFormat::Pythonic => (format!("{name}("), ")"),
        _ => return json_call(format, prefix, name, params, rules),
    };
    let mut parts = vec![lit(&head)];
    let required = params["required"].as_array().cloned().unwrap_or_default();
    for (i, key) in required.iter().filter_map(Value::as_str).enumerate() {
        let schema = &params["properties"][key];
        let at = format!("{prefix}-p{i}");
        if format == CallFormat::Pythonic && i > 0 {
            parts.push(lit(", "));
        }
        parts.push(param_rule(format, &at, key, schema, rules)?);
    }
    parts.extend((!tail.is_empty()).then(|| lit(tail)));
    Ok(parts.join(" "))
}

/// A call whose arguments are one JSON object.
fn json_call(
    format: CallFormat,
    prefix: &str,
    name: &str,
    params: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let args = json_rule(&format!("{prefix}-a"), params, rules)?;
    let (head, tail) = match format {
        CallFormat::DeepSeek => (
            format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"),
            "<｜tool▁call▁end｜>",
        ),
        CallFormat::Kimi => (
            format!("<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"),
            "<|tool_call_end|>",
        ),
        CallFormat::Harmony => (
            format!("{HARMONY_OPEN}functions.{name} <|constrain|>json<|message|>"),
            "<|call|>",
        ),
        _ => (format!("{{\"name\": \"{name}\", \"arguments\": "), "}"),
    };
    Ok(around(&head, &args, tail))
}

/// One parameter `key` of `schema` written `format`'s way.
fn param_rule(
    format: CallFormat,
    prefix: &str,
    key: &str,
    schema: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let text = schema["type"] == "string" && format != CallFormat::Pythonic;
    let value = if text {
        as_text(key, schema)?;
        text_rule(schema)
    } else {
        json_rule(prefix, schema, rules)?
    };
    let (head, tail) = match format {
        CallFormat::XmlFunction => (format!("<parameter={key}>\n"), "\n</parameter>\n"),
        CallFormat::Glm => (
            format!("<arg_key>{key}</arg_key>\n<arg_value>"),
            "</arg_value>\n",
        ),
        CallFormat::MiniMax => (format!("<parameter name=\"{key}\">"), "</parameter>\n"),
        CallFormat::Dsml => (
            format!("<｜DSML｜parameter name=\"{key}\" string=\"{text}\">"),
            "</｜DSML｜parameter>\n",
        ),
        _ => (format!("{key}="), ""),
    };
    Ok(around(&head, &value, tail))
}

/// A string parameter written as bare text honours its enum, const and
/// lengths, not a `pattern`: that is refused (a `format` is an annotation).
fn as_text(key: &str, schema: &Value) -> Result<(), GrammarError> {
    match schema.get("pattern") {
        None => Ok(()),
        Some(_) => Err(GrammarError::Refused(SchemaRefusal {
            pointer: format!("/properties/{key}"),
            keyword: "pattern".into(),
            why: "this template writes the parameter as bare text, whose grammar holds only an enum, a const and lengths"
                .into(),
            kind: RefusalKind::Unsupported,
        })),
    }
}

/// A string parameter as bare text: one of its `enum`/`const`, else text
/// without `<` within its length bounds.
fn text_rule(schema: &Value) -> String {
    let choices: Vec<String> = match (&schema["enum"], &schema["const"]) {
        (Value::Array(l), _) => l.iter().filter_map(Value::as_str).map(lit).collect(),
        (_, Value::String(s)) => vec![lit(s)],
        _ => Vec::new(),
    };
    if !choices.is_empty() {
        return format!("( {} )", choices.join(" | "));
    }
    let min = schema["minLength"].as_u64().unwrap_or(0);
    match schema["maxLength"].as_u64() {
        Some(max) => format!("[^<]{{{min},{}}}", max.max(min)),
        None => format!("[^<]{{{min},}}"),
    }
}

/// `schema`'s JSON grammar as rules named from `prefix`: its root rule's name.
fn json_rule(
    prefix: &str,
    schema: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let gbnf = schema_to_gbnf(schema)?;
    rules.push(rename(&gbnf, prefix).trim_end().to_string());
    Ok(format!("{prefix}-root"))
}

/// `g` for a reply that starts inside an open reasoning block (the
/// generation prompt ends with `<think>`): the block closed at once, then
/// what `g` forces, so the forced call or JSON is the answer, not reasoning.
/// A lazy grammar is left as it is (free text runs until its trigger).
pub fn after_open_reasoning(g: Grammar) -> Grammar {
    if !g.triggers.is_empty() {
        return g;
    }
    let inner = rename(&g.gbnf, "answer");
    Grammar {
        gbnf: format!("{ROOT} ::= \"</think>\" [\\n]* answer-{ROOT}\n{inner}"),
        triggers: Vec::new(),
    }
}

/// `gbnf` with each rule name (defined or used) put under `prefix`, so that
/// grammars converted apart can share one file. Literals, character classes
/// and repetition counts are copied as they are.
pub(crate) fn rename(gbnf: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(gbnf.len() * 2);
    let mut word = String::new();
    let mut chars = gbnf.chars();
    let flush = |out: &mut String, word: &mut String| {
        if !word.is_empty() {
            out.push_str(prefix);
            out.push('-');
            out.push_str(word);
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        let close = match c {
            '"' => '"',
            '[' => ']',
            '{' => '}',
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                word.push(c);
                continue;
            }
            c => {
                flush(&mut out, &mut word);
                out.push(c);
                continue;
            }
        };
        flush(&mut out, &mut word);
        out.push(c);
        while let Some(d) = chars.next() {
            out.push(d);
            if d == '\\' && close != '}' {
                out.extend(chars.next());
            } else if d == close {
                break;
            }
        }
    }
    flush(&mut out, &mut word);
    out
}

/// `mid` between the literals `head` and `tail` (left out when empty).
fn around(head: &str, mid: &str, tail: &str) -> String {
    [lit(head), mid.to_string(), lit(tail)]
        .into_iter()
        .filter(|p| p != "\"\"")
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s` as a GBNF literal (empty: the empty literal): GBNF's string literals
/// take JSON's escapes (`\"`, `\\`, `\n`, `\u00XX`).
fn lit(s: &str) -> String {
    bmoe_decode::telemetry::json_string(s)
}

#[cfg(test)]
#[path = "tool_grammar_tests.rs"]
mod tests;
