//! The GBNF pieces the formats build their forced calls from: literals,
//! a JSON object's rule from its schema (llama.cpp's converter), and
//! parameters written apart (each wrapped the format's way, a string one as
//! bare text). A leaf: it names no other file of `chat/`.

use serde_json::Value;

use crate::llama::grammar::{schema_to_gbnf, GrammarError};
use crate::llama::schema_check::{RefusalKind, SchemaRefusal};

/// A call whose arguments are one JSON object, between `head` and `tail`.
pub(crate) fn json_call(
    head: &str,
    tail: &str,
    prefix: &str,
    params: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let args = json_rule(&format!("{prefix}-a"), params, rules)?;
    Ok(around(head, &args, tail))
}

/// A call written as `{"name": NAME, "arguments": {..}}` (Hermes and the
/// JSON lists).
pub(crate) fn name_and_arguments(
    prefix: &str,
    name: &str,
    params: &Value,
    rules: &mut Vec<String>,
) -> Result<String, GrammarError> {
    let head = format!("{{\"name\": \"{name}\", \"arguments\": ");
    json_call(&head, "}", prefix, params, rules)
}

/// A call that writes its schema's required parameters apart, in the
/// schema's order: `head`, each parameter (after `sep` from the one before
/// it), `tail` (left out when empty).
pub(crate) struct Apart {
    pub(crate) head: String,
    pub(crate) tail: &'static str,
    pub(crate) sep: Option<&'static str>,
    /// A string-typed parameter is written as bare text (one of its `enum`
    /// when it has one); else every parameter is JSON.
    pub(crate) strings_as_text: bool,
}

impl Apart {
    /// The call's expression; `param(key, as_text)`: the text before and
    /// after the parameter `key`'s value.
    pub(crate) fn rule(
        &self,
        prefix: &str,
        params: &Value,
        rules: &mut Vec<String>,
        param: impl Fn(&str, bool) -> (String, &'static str),
    ) -> Result<String, GrammarError> {
        let mut parts = vec![lit(&self.head)];
        let required = params["required"].as_array().cloned().unwrap_or_default();
        for (i, key) in required.iter().filter_map(Value::as_str).enumerate() {
            let schema = &params["properties"][key];
            let at = format!("{prefix}-p{i}");
            if let Some(sep) = self.sep.filter(|_| i > 0) {
                parts.push(lit(sep));
            }
            let text = schema["type"] == "string" && self.strings_as_text;
            let value = if text {
                as_text(key, schema)?;
                text_rule(schema)
            } else {
                json_rule(&at, schema, rules)?
            };
            let (head, tail) = param(key, text);
            parts.push(around(&head, &value, tail));
        }
        parts.extend((!self.tail.is_empty()).then(|| lit(self.tail)));
        Ok(parts.join(" "))
    }
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
pub(crate) fn text_rule(schema: &Value) -> String {
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
pub(crate) fn lit(s: &str) -> String {
    bmoe_decode::telemetry::json_string(s)
}
