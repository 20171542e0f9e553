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
//!
//! What a format writes around its call, its call and each argument is the
//! format's own (its `Syntax`, under `tool_calls/`); this file puts the
//! tools' calls together into one grammar.

use serde_json::{json, Value};

use super::tool_calls::gbnf::{lit, rename};
use super::tool_calls::CallFormat;
use crate::llama::grammar::{regex_escape, Grammar, GrammarError, ROOT};
use crate::llama::schema_check::schema_check;

#[cfg(test)]
use super::tool_calls::{gbnf::text_rule, HARMONY_OPEN};

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
    let syntax = format.syntax();
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
            .and_then(|()| syntax.call_rule(&format!("t{index}"), name, &params, &mut rules));
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
    let (open, close) = syntax.forced_block();
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
    regex_escape(format.syntax().trigger())
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

#[cfg(test)]
#[path = "tool_grammar_tests.rs"]
mod tests;
