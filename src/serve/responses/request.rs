//! A Responses request (`POST /v1/responses`) checked into a [`JobSpec`]:
//! `instructions` and `system`/`developer` messages become one leading
//! system message, `input` items chat messages (`function_call` items the
//! assistant's `tool_calls`, `function_call_output` items `tool` messages,
//! `reasoning` items the next assistant message's `reasoning_content`), and
//! function tools OpenAI chat-shaped functions. Every refusal is a 400 whose
//! `param` names the top-level field, its message the path inside it.

use bmoe_decode::sampling::SamplingParams;
use serde_json::{json, Map, Value};

use crate::chat::tool_grammar::ToolChoice;
use crate::chat::Message;
use crate::serve::api::{ApiError, Common, JobSpec, PromptSpec};
use crate::serve::constraint::{response_format, Constraint};
use crate::serve::json_in::kind;
use crate::serve::tool_names::{ToolNames, OPENAI_MAX_CHARS};

type Obj = Map<String, Value>;

/// A checked request, with what its response echoes.
#[derive(Debug)]
pub(super) struct ResponsesRequest {
    pub(super) spec: JobSpec,
    pub(super) instructions: Option<String>,
    pub(super) max_output_tokens: Option<i64>,
}

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// Parse and check a `/v1/responses` body.
pub(super) fn parse(body: &[u8], defaults: &SamplingParams) -> Result<ResponsesRequest, ApiError> {
    let v = crate::serve::json_in::body(body)?;
    let Value::Object(o) = v else {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    };
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            "previous_response_id",
            "previous_response_id: this server keeps no responses; send the whole conversation in input (store: false)",
        ));
    }
    for key in ["store", "stream", "parallel_tool_calls"] {
        flag(&o, key)?;
    }
    let instructions = match o.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(bad(
                "instructions",
                format!("instructions must be a string, not {}", kind(v)),
            ))
        }
    };
    let mut chat = Chat::default();
    chat.system.extend(instructions.clone());
    input(o.get("input"), &mut chat)?;
    let (tools, choice) = tools(&o)?;
    let format = response_format(o.get("text").and_then(|t| t.get("format")), "text.format")?;
    let max_output_tokens = int(&o, "max_output_tokens")?;
    if let Some(n) = max_output_tokens.filter(|&n| n < 1) {
        return Err(bad(
            "max_output_tokens",
            format!("max_output_tokens = {n}: give at least 1"),
        ));
    }
    let common = Common {
        max_tokens: max_output_tokens,
        temperature: number(&o, "temperature")?,
        top_p: number(&o, "top_p")?,
        stream: flag(&o, "stream")?,
        user: string_field(&o, "user")?.or(string_field(&o, "safety_identifier")?),
        ..Common::default()
    };
    let prompt = PromptSpec::Chat {
        messages: chat.messages()?,
        tools,
        options: Default::default(),
    };
    let offered = matches!(&prompt, PromptSpec::Chat { tools: Some(_), .. });
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
            return Err(bad(
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
        None | Some(Value::Null) => return Err(bad("input", "input is required")),
        Some(v) => {
            return Err(bad(
                "input",
                format!("input must be a string or a list of items, not {}", kind(v)),
            ))
        }
    };
    for (i, item) in items.iter().enumerate() {
        let path = format!("input[{i}]");
        let Value::Object(item) = item else {
            return Err(bad(
                "input",
                format!("{path} must be an object, not {}", kind(item)),
            ));
        };
        let ty = match item.get("type") {
            None | Some(Value::Null) if item.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(bad("input", format!("{path}.type is required (message, function_call, function_call_output or reasoning)"))),
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
                return Err(bad(
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
            return Err(bad(
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
            return Err(bad(
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
            return Err(bad(
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
        let Value::Object(p) = p else {
            return Err(bad(
                "input",
                format!("{path} must be an object, not {}", kind(p)),
            ));
        };
        let key = match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            Some(other) => {
                return Err(bad(
                    "input",
                    format!("{path}: parts of type {other:?} are not supported; this server takes text (input_text, output_text)"),
                ))
            }
            None => return Err(bad("input", format!("{path}.type is required"))),
        };
        out.push_str(string(p, key, &path)?);
    }
    Ok(out)
}

/// The function tools as the chat template expects them (OpenAI chat-shaped),
/// or None when there are none or `tool_choice` is `none`, and the choice
/// among them. Tools of other types (web search, hosted, namespaced, custom)
/// are left out, said at -v.
fn tools(o: &Obj) -> Result<(Option<Value>, ToolChoice), ApiError> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(l)) => l,
        Some(v) => {
            return Err(bad(
                "tools",
                format!("tools must be a list of tools, not {}", kind(v)),
            ))
        }
    };
    let mut names = ToolNames::new(OPENAI_MAX_CHARS);
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let Value::Object(t) = t else {
            return Err(bad(
                "tools",
                format!("{path} must be an object, not {}", kind(t)),
            ));
        };
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("");
        if ty != "function" {
            tracing::info!("{path}: a tool of type {ty:?} left out: this server offers the model function tools only");
            continue;
        }
        let name = names
            .take(&format!("{path}.name"), t.get("name"))
            .map_err(|m| bad("tools", m))?;
        let mut function = json!({"name": name});
        match t.get("parameters") {
            None | Some(Value::Null) => {}
            Some(p @ Value::Object(_)) => function["parameters"] = p.clone(),
            Some(v) => {
                return Err(bad(
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
    Ok(match tool_choice(o, &out)? {
        Some(choice) if !out.is_empty() => (Some(Value::Array(out)), choice),
        _ => (None, ToolChoice::Auto),
    })
}

/// `tool_choice`: None for `none` (no tools offered). `required` forces a
/// call, a named function (one of the tools) that one; choices of hosted
/// tools are taken as `auto`.
fn tool_choice(o: &Obj, tools: &[Value]) -> Result<Option<ToolChoice>, ApiError> {
    let shape = "tool_choice: give \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}";
    match o.get("tool_choice") {
        None | Some(Value::Null) => Ok(Some(ToolChoice::Auto)),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(None),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" if tools.is_empty() => Err(bad(
                "tool_choice",
                "tool_choice \"required\" needs function tools to call: give the request's tools, or leave tool_choice out",
            )),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad("tool_choice", format!("tool_choice {s:?}: {shape}"))),
        },
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tool_choice", shape))?;
                if tools.iter().any(|t| t["function"]["name"] == name) {
                    Ok(Some(ToolChoice::Named(name.into())))
                } else {
                    Err(bad(
                        "tool_choice",
                        format!("tool_choice names {name:?}, which is not among the request's function tools"),
                    ))
                }
            }
            Some(other) => {
                tracing::info!("tool_choice of type {other:?} taken as auto");
                Ok(Some(ToolChoice::Auto))
            }
            None => Err(bad("tool_choice", shape)),
        },
        Some(_) => Err(bad("tool_choice", shape)),
    }
}

/// A string field at `path` (required).
fn string<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad("input", format!("{path}.{key} is required"))),
        Some(v) => Err(bad(
            "input",
            format!("{path}.{key} must be a string, not {}", kind(v)),
        )),
    }
}

/// The top-level fields a refusal names by `param` ([`ApiError`]'s is `&'static`).
fn param(key: &str) -> &'static str {
    const KNOWN: [&str; 8] = [
        "max_output_tokens",
        "temperature",
        "top_p",
        "store",
        "stream",
        "parallel_tool_calls",
        "user",
        "safety_identifier",
    ];
    KNOWN.into_iter().find(|k| *k == key).unwrap_or("input")
}

fn number(o: &Obj, key: &str) -> Result<Option<f32>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| {
            bad(
                param(key),
                format!("{key} must be a number, not {}", kind(v)),
            )
        }),
    }
}

fn int(o: &Obj, key: &str) -> Result<Option<i64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            bad(
                param(key),
                format!("{key} must be a whole number, not {}", kind(v)),
            )
        }),
    }
}

fn flag(o: &Obj, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(
            param(key),
            format!("{key} must be true or false, not {}", kind(v)),
        )),
    }
}

fn string_field(o: &Obj, key: &str) -> Result<Option<String>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(bad(
            param(key),
            format!("{key} must be a string, not {}", kind(v)),
        )),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
