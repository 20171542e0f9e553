//! A Responses request (`POST /v1/responses`) checked into a [`JobSpec`]:
//! `instructions` and `system`/`developer` messages become one leading
//! system message, `input` items chat messages (`function_call` items the
//! assistant's `tool_calls`, `function_call_output` items `tool` messages,
//! `reasoning` items the next assistant message's `reasoning_content`), and
//! function tools OpenAI chat-shaped functions. Every refusal is a 400 whose
//! `param` names the top-level field, its message the path inside it.

use bmoe_decode::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::chat::tool_grammar::ToolChoice;
use crate::chat::Message;
use crate::serve::common::Common;
use crate::serve::constraint::response_format;
use crate::serve::error::ApiError;
use crate::serve::job::{Constraint, JobSpec, PromptSpec};
use crate::serve::json_in::{self, kind, object, string, Flag, Int, Num, Obj, Text};
use crate::serve::tool_names::{ToolNames, OPENAI_MAX_CHARS};

/// A checked request, with what its response echoes.
#[derive(Debug)]
pub(super) struct ResponsesRequest {
    pub(super) spec: JobSpec,
    pub(super) instructions: Option<String>,
    pub(super) max_output_tokens: Option<i64>,
}

/// The body's fields (others, such as `model`, `reasoning`, `include` or
/// `prompt_cache_key`, are ignored); `input`'s items are walked by hand.
#[derive(Debug, Deserialize)]
struct Body {
    /// Read only to refuse what is not true or false (nothing is stored;
    /// calls are parsed however many the model makes).
    #[serde(rename = "store")]
    _store: Option<Flag>,
    #[serde(rename = "parallel_tool_calls")]
    _parallel_tool_calls: Option<Flag>,
    stream: Option<Flag>,
    instructions: Option<Text>,
    max_output_tokens: Option<Int>,
    temperature: Option<Num>,
    top_p: Option<Num>,
    user: Option<Text>,
    safety_identifier: Option<Text>,
    input: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    text: Option<Value>,
}

/// Parse and check a `/v1/responses` body.
pub(super) fn parse(body: &[u8], defaults: &SamplingParams) -> Result<ResponsesRequest, ApiError> {
    let v = json_in::body(body)?;
    if v.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::at(
            "previous_response_id",
            "previous_response_id: this server keeps no responses; send the whole conversation in input (store: false)",
        ));
    }
    let b: Body = json_in::read(&v)?;
    let instructions = b.instructions.map(|t| t.0);
    let mut chat = Chat::default();
    chat.system.extend(instructions.clone());
    input(b.input.as_ref(), &mut chat)?;
    let (tools, choice) = tools(b.tools.as_ref(), b.tool_choice.as_ref())?;
    let format = response_format(b.text.as_ref().and_then(|t| t.get("format")), "text.format")?;
    let max_output_tokens = b.max_output_tokens.map(|n| n.0);
    if let Some(n) = max_output_tokens.filter(|&n| n < 1) {
        return Err(ApiError::at(
            "max_output_tokens",
            format!("max_output_tokens = {n}: give at least 1"),
        ));
    }
    let common = Common {
        max_tokens: max_output_tokens,
        temperature: b.temperature.map(|n| n.0),
        top_p: b.top_p.map(|n| n.0),
        stream: b.stream.is_some_and(|f| f.0),
        user: b.user.or(b.safety_identifier).map(|t| t.0),
        ..Common::default()
    };
    let prompt = PromptSpec::Chat {
        messages: chat.messages()?,
        tools,
        options: Default::default(),
    };
    let offered = prompt.tools().is_some();
    let mut spec = common.into_spec(prompt, defaults)?;
    spec.constraint = Constraint::of(choice, offered, format);
    Constraint::check(&spec)?;
    Ok(ResponsesRequest {
        spec,
        instructions,
        max_output_tokens,
    })
}

/// The conversation as it is read: system texts apart (they lead, joined),
/// reasoning waiting for the assistant message it belongs to.
#[derive(Debug, Default)]
struct Chat {
    system: Vec<String>,
    turns: Vec<Message>,
    reasoning: Vec<String>,
}

impl Chat {
    /// An assistant message to add to: the last one when it is an
    /// assistant's, else a new one; pending reasoning goes on it.
    fn assistant(&mut self) -> &mut Message {
        if self.turns.last().is_none_or(|m| m.role != "assistant") {
            self.turns.push(Message::new("assistant", ""));
        }
        let last = self.turns.len() - 1;
        debug_assert_eq!(self.turns[last].role, "assistant");
        let m = &mut self.turns[last];
        if !self.reasoning.is_empty() {
            let r = std::mem::take(&mut self.reasoning).join("\n");
            m.extra.insert("reasoning_content".into(), r.into());
        }
        m
    }

    fn messages(self) -> Result<Vec<Message>, ApiError> {
        if self.turns.is_empty() {
            return Err(ApiError::at(
                "input",
                "input holds no user message: give a string or at least one message item",
            ));
        }
        let mut out = Vec::with_capacity(self.turns.len() + 1);
        if !self.system.is_empty() {
            out.push(Message::new("system", &self.system.join("\n\n")));
        }
        out.extend(self.turns);
        Ok(out)
    }
}

/// `input`: a string (one user message) or a list of items.
fn input(v: Option<&Value>, chat: &mut Chat) -> Result<(), ApiError> {
    let items = match v {
        Some(Value::String(s)) => {
            chat.turns.push(Message::new("user", s));
            return Ok(());
        }
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(ApiError::at("input", "input is required")),
        Some(v) => {
            return Err(ApiError::at(
                "input",
                format!("input must be a string or a list of items, not {}", kind(v)),
            ))
        }
    };
    for (i, item) in items.iter().enumerate() {
        let path = format!("input[{i}]");
        let item = object(item, &path)?;
        let ty = match item.get("type") {
            None | Some(Value::Null) if item.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(ApiError::at("input", format!("{path}.type is required (message, function_call, function_call_output or reasoning)"))),
        };
        match ty {
            "message" => message(&path, item, chat)?,
            "function_call" => function_call(&path, item, chat)?,
            "function_call_output" => {
                let id = string(item, "call_id", &path)?;
                let output = text(item.get("output"), &format!("{path}.output"))?;
                let mut m = Message::new("tool", &output);
                m.extra.insert("tool_call_id".into(), json!(id));
                chat.turns.push(m);
            }
            "reasoning" => chat.reasoning.extend(reasoning_text(item)),
            other => {
                return Err(ApiError::at(
                    "input",
                    format!("{path}.type {other:?}: this server takes message, function_call, function_call_output and reasoning items"),
                ))
            }
        }
    }
    Ok(())
}

/// A message item: system and developer text joins the system prompt,
/// user and assistant text is a turn.
fn message(path: &str, item: &Obj, chat: &mut Chat) -> Result<(), ApiError> {
    let role = string(item, "role", path)?;
    let content = text(item.get("content"), &format!("{path}.content"))?;
    match role {
        "system" | "developer" => chat.system.push(content),
        "user" => chat.turns.push(Message::new("user", &content)),
        "assistant" => {
            let m = chat.assistant();
            if !m.content.is_empty() {
                m.content.push('\n');
            }
            m.content.push_str(&content);
        }
        other => {
            return Err(ApiError::at(
                "input",
                format!("{path}.role {other:?}: use user, assistant, system or developer"),
            ))
        }
    }
    Ok(())
}

/// A `function_call` item as a call of the assistant's message (its
/// arguments' JSON text read into an object, as templates expect).
fn function_call(path: &str, item: &Obj, chat: &mut Chat) -> Result<(), ApiError> {
    let id = string(item, "call_id", path)?;
    let name = string(item, "name", path)?;
    let arguments = match item.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(o @ Value::Object(_)) => o,
            _ => Value::String(s.clone()),
        },
        Some(v) => {
            return Err(ApiError::at(
                "input",
                format!("{path}.arguments must be a string of JSON, not {}", kind(v)),
            ))
        }
    };
    let call =
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    let m = chat.assistant();
    match m.extra.get_mut("tool_calls") {
        Some(Value::Array(calls)) => calls.push(call),
        _ => drop(m.extra.insert("tool_calls".into(), json!([call]))),
    }
    Ok(())
}

/// A reasoning item's readable text: its `content` texts, else its summary's.
fn reasoning_text(item: &Obj) -> Option<String> {
    let texts = |key: &str| -> Vec<String> {
        item.get(key)
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let content = texts("content");
    let parts = if content.is_empty() {
        texts("summary")
    } else {
        content
    };
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// A string, or a list of text parts (`input_text`, `output_text`, `text`,
/// `refusal`) joined; other parts (images, files, audio) refused.
fn text(v: Option<&Value>, path: &str) -> Result<String, ApiError> {
    let parts = match v {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(v) => {
            return Err(ApiError::at(
                "input",
                format!(
                    "{path} must be a string or a list of text parts, not {}",
                    kind(v)
                ),
            ))
        }
    };
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let p = object(p, &path)?;
        let key = match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            Some(other) => {
                return Err(ApiError::at(
                    "input",
                    format!("{path}: parts of type {other:?} are not supported; this server takes text (input_text, output_text)"),
                ))
            }
            None => return Err(ApiError::at("input", format!("{path}.type is required"))),
        };
        out.push_str(string(p, key, &path)?);
    }
    Ok(out)
}

/// The function tools as the chat template expects them (OpenAI chat-shaped),
/// or None when there are none or `tool_choice` is `none`, and the choice
/// among them. Tools of other types (web search, hosted, namespaced, custom)
/// are left out, said at -v.
fn tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<(Option<Value>, ToolChoice), ApiError> {
    let list = match tools {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(l)) => l,
        Some(v) => {
            return Err(ApiError::at(
                "tools",
                format!("tools must be a list of tools, not {}", kind(v)),
            ))
        }
    };
    let mut names = ToolNames::new(OPENAI_MAX_CHARS);
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let t = object(t, &path)?;
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("");
        if ty != "function" {
            tracing::info!("{path}: a tool of type {ty:?} left out: this server offers the model function tools only");
            continue;
        }
        let name = names
            .take(&format!("{path}.name"), t.get("name"))
            .map_err(|m| ApiError::at("tools", m))?;
        let mut function = json!({"name": name});
        match t.get("parameters") {
            None | Some(Value::Null) => {}
            Some(p @ Value::Object(_)) => function["parameters"] = p.clone(),
            Some(v) => {
                return Err(ApiError::at(
                    "tools",
                    format!(
                        "{path}.parameters must be a JSON Schema object, not {}",
                        kind(v)
                    ),
                ))
            }
        }
        if let Some(d) = t.get("description").filter(|d| d.is_string()) {
            function["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(match tool_choice(choice, &out)? {
        Some(choice) if !out.is_empty() => (Some(Value::Array(out)), choice),
        _ => (None, ToolChoice::Auto),
    })
}

/// `tool_choice`: None for `none` (no tools offered). `required` forces a
/// call, a named function (one of the tools) that one; choices of hosted
/// tools are taken as `auto`.
fn tool_choice(choice: Option<&Value>, tools: &[Value]) -> Result<Option<ToolChoice>, ApiError> {
    let shape = "tool_choice: give \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}";
    match choice {
        None | Some(Value::Null) => Ok(Some(ToolChoice::Auto)),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(None),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" if tools.is_empty() => Err(ApiError::at(
                "tool_choice",
                "tool_choice \"required\" needs function tools to call: give the request's tools, or leave tool_choice out",
            )),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(ApiError::at("tool_choice", format!("tool_choice {s:?}: {shape}"))),
        },
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::at("tool_choice", shape))?;
                if tools.iter().any(|t| t["function"]["name"] == name) {
                    Ok(Some(ToolChoice::Named(name.into())))
                } else {
                    Err(ApiError::at(
                        "tool_choice",
                        format!("tool_choice names {name:?}, which is not among the request's function tools"),
                    ))
                }
            }
            Some(other) => {
                tracing::info!("tool_choice of type {other:?} taken as auto");
                Ok(Some(ToolChoice::Auto))
            }
            None => Err(ApiError::at("tool_choice", shape)),
        },
        Some(_) => Err(ApiError::at("tool_choice", shape)),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
