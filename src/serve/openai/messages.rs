//! A chat request's messages, `tools` and `tool_choice` as OpenAI's clients
//! send them, checked into what the chat template reads: each message's
//! text, with `tool_calls` (their `arguments` JSON text parsed into an
//! object, as Hugging Face templates expect), `tool_call_id`, `name` and
//! `reasoning_content` passed on. A bad shape is a 400 naming the field.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::chat::tool_grammar::ToolChoice;
use crate::chat::Message;
use crate::serve::error::ApiError;
use crate::serve::json_in::{kind, Text};
use crate::serve::tool_names::{ToolNames, OPENAI_MAX_CHARS};

/// One message as sent.
#[derive(Debug, Deserialize)]
pub(crate) struct InMessage {
    pub(crate) role: String,
    #[serde(default)]
    pub(crate) content: Option<Value>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Value>,
    #[serde(default)]
    pub(crate) tool_call_id: Option<Text>,
    #[serde(default)]
    pub(crate) name: Option<Text>,
    #[serde(default)]
    pub(crate) reasoning_content: Option<Text>,
}

fn bad(param: &'static str, message: String) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// The messages checked, in order.
pub(crate) fn messages(given: Vec<InMessage>) -> Result<Vec<Message>, ApiError> {
    if given.is_empty() {
        return Err(bad(
            "messages",
            "messages is empty: give at least one message".into(),
        ));
    }
    given
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

/// A chat message with its content as text (parts other than text refused).
fn message(i: usize, m: InMessage) -> Result<Message, ApiError> {
    if !matches!(
        m.role.as_str(),
        "system" | "developer" | "user" | "assistant" | "tool"
    ) {
        return Err(bad(
            "messages",
            format!(
                "messages[{i}].role {:?}: use system, user, assistant or tool",
                m.role
            ),
        ));
    }
    let role = if m.role == "developer" {
        "system"
    } else {
        &m.role
    };
    let mut out = Message::new(role, &content(i, m.content)?);
    if let Some(calls) = m.tool_calls.filter(|c| !c.is_null()) {
        let calls = tool_calls(i, calls)?;
        out.extra.insert("tool_calls".into(), calls);
    }
    let strings = [
        ("tool_call_id", m.tool_call_id),
        ("name", m.name),
        ("reasoning_content", m.reasoning_content),
    ];
    for (key, v) in strings {
        if let Some(Text(s)) = v {
            out.extra.insert(key.into(), s.into());
        }
    }
    Ok(out)
}

/// Text, a list of text parts (joined), or null (empty).
fn content(i: usize, v: Option<Value>) -> Result<String, ApiError> {
    let parts = match v {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(bad(
                "messages",
                format!("messages[{i}].content: give a string, a list of text parts, or null"),
            ))
        }
    };
    let mut text = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some(kind), _) if kind != "text" => {
                return Err(bad(
                    "messages",
                    format!("messages[{i}].content: a part of type {kind:?}: this server takes text parts only"),
                ))
            }
            _ => {
                return Err(bad(
                    "messages",
                    format!("messages[{i}].content: each part is {{\"type\": \"text\", \"text\": \"...\"}}"),
                ))
            }
        }
    }
    Ok(text)
}

/// An assistant's `tool_calls`: `[{id, type: "function", function: {name,
/// arguments}}]`, the arguments' JSON text read into an object when it is
/// one (kept as text otherwise).
fn tool_calls(i: usize, v: Value) -> Result<Value, ApiError> {
    let shape = || {
        bad(
            "messages",
            format!("messages[{i}].tool_calls: give a list of {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"),
        )
    };
    let Value::Array(calls) = v else {
        return Err(shape());
    };
    let mut out = Vec::with_capacity(calls.len());
    for mut call in calls {
        let f = call.get_mut("function").ok_or_else(shape)?;
        if !f.get("name").is_some_and(Value::is_string) {
            return Err(shape());
        }
        let args = match f.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(o @ Value::Object(_)) => o,
                _ => Value::String(s.clone()),
            },
            Some(o @ Value::Object(_)) => o.clone(),
            Some(_) => return Err(shape()),
        };
        f["arguments"] = args;
        if call.get("type").is_none() {
            call["type"] = "function".into();
        }
        out.push(call);
    }
    Ok(Value::Array(out))
}

/// The tools the template gets and the choice among them: the request's
/// `tools` checked, or None when it gives none or `tool_choice` is `"none"`.
pub(crate) fn tools(
    tools: Option<Value>,
    choice: Option<Value>,
) -> Result<(Option<Value>, ToolChoice), ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if list.is_empty() => None,
        Some(Value::Array(list)) => Some(check_tools(list)?),
        Some(_) => return Err(tools_shape(None)),
    };
    let choice = match choice {
        None | Some(Value::Null) => Some(ToolChoice::Auto),
        Some(c) => check_choice(&c, tools.as_ref())?,
    };
    Ok(match choice {
        Some(c) => (tools, c),
        None => (None, ToolChoice::Auto),
    })
}

fn tools_shape(at: Option<usize>) -> ApiError {
    let which = at.map_or("tools".to_string(), |i| format!("tools[{i}]"));
    bad(
        "tools",
        format!("{which}: give a list of {{\"type\": \"function\", \"function\": {{\"name\": \"...\", \"description\": \"...\", \"parameters\": {{JSON Schema}}}}}}"),
    )
}

/// Each tool is `{"type": "function", "function": {"name", ...}}` with a
/// name both APIs take, its own ([`ToolNames`]), and, if any, an object for
/// `parameters`.
fn check_tools(list: Vec<Value>) -> Result<Value, ApiError> {
    let mut names = ToolNames::new(OPENAI_MAX_CHARS);
    for (i, t) in list.iter().enumerate() {
        let f = &t["function"];
        if t["type"] != "function" || !f.is_object() {
            return Err(tools_shape(Some(i)));
        }
        names
            .take(&format!("tools[{i}].function.name"), f.get("name"))
            .map_err(|m| bad("tools", m))?;
        match f.get("parameters") {
            None | Some(Value::Object(_)) => {}
            Some(v) => {
                return Err(bad(
                    "tools",
                    format!("tools[{i}].function.parameters must be a JSON Schema object (such as {{\"type\": \"object\", \"properties\": {{...}}}}), not {}; leave it out for a function that takes no arguments", kind(v)),
                ))
            }
        }
    }
    Ok(Value::Array(list))
}

/// `"none"` (None), `"auto"`, `"required"` or `{"type": "function",
/// "function": {"name": N}}` naming one of the tools.
fn check_choice(c: &Value, tools: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    if let Some(word) = c.as_str() {
        return match word {
            "none" => Ok(None),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" if tools.and_then(Value::as_array).is_none_or(Vec::is_empty) => Err(bad(
                "tool_choice",
                "tool_choice \"required\" needs tools to call: give the request's tools, or leave tool_choice out".into(),
            )),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad(
                "tool_choice",
                format!("tool_choice {word:?}: give \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            )),
        };
    }
    let Some(name) = c["function"]["name"]
        .as_str()
        .filter(|_| c["type"] == "function")
    else {
        return Err(bad(
            "tool_choice",
            "tool_choice: give \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}".into(),
        ));
    };
    let known = tools
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|t| t["function"]["name"] == name));
    if !known {
        return Err(bad(
            "tool_choice",
            format!("tool_choice names {name:?}, which is not among the request's tools"),
        ));
    }
    Ok(Some(ToolChoice::Named(name.into())))
}

#[cfg(test)]
#[path = "messages_tests.rs"]
mod tests;
