//! What a parse gives (a reply's calls and the text around them) and the
//! helpers every format reads a call's name and arguments with. A leaf: it
//! names no other file of `chat/`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 hex digits, unique within the process.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A reply split up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The text outside the calls (trimmed at its end when there are calls).
    pub content: String,
    /// Harmony's `analysis` channel, when the reply had one.
    pub reasoning: Option<String>,
    pub calls: Vec<ToolCall>,
    /// The reply ended inside its last call (streamed under a call grammar,
    /// which sent it as it was written): that call holds the arguments it
    /// had, closed.
    pub cut: bool,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: &str, arguments: String) -> Self {
        Self {
            id: call_id(),
            name: name.into(),
            arguments,
        }
    }
}

/// `call_` and 24 hex digits: the clock and a process-wide counter, mixed.
pub fn call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |mut x: u64| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let a = mix(nanos ^ n.rotate_left(32));
    let b = mix(a ^ n);
    format!("call_{a:016x}{:08x}", b as u32)
}

/// A parameter's value: text when the schema says string (or it is not
/// JSON), else the JSON it reads as.
pub(crate) fn param_value(tools: Option<&Value>, function: &str, key: &str, value: &str) -> Value {
    if string_typed(tools, function, key) {
        return Value::String(value.into());
    }
    serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.into()))
}

/// Whether the request's tool `function` calls its parameter `key` a string.
pub(crate) fn string_typed(tools: Option<&Value>, function: &str, key: &str) -> bool {
    tools
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == function)
        .map(|t| &t["function"]["parameters"]["properties"][key]["type"])
        .is_some_and(|ty| ty == "string")
}

/// A call's arguments given as a JSON text: a call when they are an object
/// (written compactly), else `None`.
pub(crate) fn json_args(name: &str, args: &str) -> Option<ToolCall> {
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    match serde_json::from_str::<Value>(args.trim()).ok()? {
        v @ Value::Object(_) => Some(ToolCall::new(name, v.to_string())),
        _ => None,
    }
}

/// A call named `name` with `arguments` an object (a JSON text or missing:
/// `{}`), as the JSON-shaped formats write it.
pub(crate) fn json_call(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s).ok()? {
            o @ Value::Object(_) => o.to_string(),
            _ => return None,
        },
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall::new(name, arguments))
}

/// A function name: trimmed, not empty, no markup or spaces in it.
pub(crate) fn plain_name(name: &str) -> Option<&str> {
    let name = name.trim();
    let bad = |c: char| c.is_whitespace() || matches!(c, '<' | '>' | '"' | '{' | '}');
    (!name.is_empty() && !name.contains(bad)).then_some(name)
}
