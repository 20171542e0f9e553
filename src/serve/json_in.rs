//! A JSON request body read into the route's request type, every refusal in
//! the request's own terms: the field at fault by its path (through
//! `serde_path_to_error`, the body read once into a `serde_json::Value`), and
//! serde's Rust words (`expected struct ChatRequest`, `expected i64`,
//! `sequence`) said in JSON's (`expected an object`, `expected an integer`,
//! `array`).

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::api::ApiError;

/// The top-level fields a refusal may name as its `param` (OpenAI's error
/// field is one name; a path inside one is in the message).
const FIELDS: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
    "prompt",
    "echo",
    "logprobs",
    "suffix",
    "best_of",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
];

/// Fields of several shapes, which serde names by their Rust type
/// ("untagged enum PromptIn"): what to say instead.
const SHAPES: [(&str, &str); 2] = [
    (
        "PromptIn",
        "prompt must be a string (or a list of one string)",
    ),
    ("StopIn", "stop must be a string or a list of strings"),
];

/// The body as JSON: a 400 with serde_json's line and column when it is not
/// JSON, or not an object.
pub(crate) fn body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(None, format!("invalid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(
            None,
            format!("the body must be a JSON object, not {}", kind(&v)),
        ));
    }
    Ok(v)
}

/// `v` read as `T`; a refusal names the field's path and says what was
/// expected in JSON's words.
pub(crate) fn read<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let top = path.split(['.', '[']).next().unwrap_or("");
        let param = FIELDS.iter().copied().find(|f| *f == top);
        ApiError::invalid(param, format!("invalid request: {}", say(&path, &message)))
    })
}

/// serde's message about the field at `path`, in the request's terms.
fn say(path: &str, serde_message: &str) -> String {
    for (ty, words) in SHAPES {
        if serde_message.contains(&format!("untagged enum {ty}")) {
            return words.to_string();
        }
    }
    let words = in_json_words(serde_message);
    if path.is_empty() || path == "." {
        words
    } else {
        format!("{path}: {words}")
    }
}

/// serde's Rust words for types and values replaced by JSON's.
pub(crate) fn in_json_words(serde_message: &str) -> String {
    let mut out = serde_message.to_string();
    if let Some(at) = out.find("expected struct ") {
        let name_end = out[at + "expected struct ".len()..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(out.len(), |i| at + "expected struct ".len() + i);
        out.replace_range(at..name_end, "expected an object");
    }
    const WORDS: [(&str, &str); 8] = [
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: object"),
        ("unit value", "null"),
        ("floating point", "number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ];
    for (rust, json) in WORDS {
        out = out.replace(rust, json);
    }
    for int in [
        "i64", "u64", "i32", "u32", "i16", "u16", "i8", "u8", "usize", "isize",
    ] {
        // No name here is the start of another ("i64" before "i8").
        out = out.replace(&format!("expected {int}"), "expected an integer");
    }
    out
}

/// What kind of JSON value a refusal names ("an object").
pub(crate) fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_words_become_json_words() {
        for (serde, plain) in [
            (
                "invalid type: sequence, expected struct CompletionRequest",
                "invalid type: array, expected an object",
            ),
            (
                "invalid type: string \"x\", expected i64",
                "invalid type: string \"x\", expected an integer",
            ),
            (
                "invalid type: floating point `1.5`, expected u32",
                "invalid type: number `1.5`, expected an integer",
            ),
            (
                "invalid type: integer `3`, expected a sequence",
                "invalid type: integer `3`, expected an array",
            ),
            (
                "invalid type: map, expected f32",
                "invalid type: object, expected a number",
            ),
            ("missing field `role`", "missing field `role`"),
        ] {
            assert_eq!(in_json_words(serde), plain);
        }
    }

    #[test]
    fn a_refusal_names_the_path_and_its_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            max_tokens: Option<i64>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            messages: Vec<Inner>,
        }
        let v = body(br#"{"messages": [{"max_tokens": 1}, {"max_tokens": "x"}]}"#).unwrap();
        let e = read::<Outer>(&v).unwrap_err();
        assert_eq!(e.param, Some("messages"));
        assert_eq!(
            e.message,
            "invalid request: messages[1].max_tokens: invalid type: string \"x\", expected an integer"
        );
        let e = body(b"[1]").unwrap_err();
        assert_eq!(e.message, "the body must be a JSON object, not an array");
        assert!(body(b"{").unwrap_err().message.starts_with("invalid JSON"));
    }
}
