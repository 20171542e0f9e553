//! An Anthropic Messages request checked into a [`JobSpec`]: `system` becomes
//! a system message, `tool_use` blocks the assistant message's `tool_calls`,
//! `tool_result` blocks `tool` messages and the tools OpenAI-shaped functions,
//! as chat templates expect them. The body is read field by field so that
//! every refusal names the field at fault in the request's own terms.

use bmoe_decode::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::chat::tool_grammar::ToolChoice;
use crate::chat::Message;
use crate::serve::common::{Common, StopIn};
use crate::serve::error::ApiError;
use crate::serve::job::{Constraint, JobSpec, PromptSpec, MAX_STOP_STRINGS};
use crate::serve::json_in::{self, kind, object, string, Flag, Int, List, Num, Obj, Text};
use crate::serve::tool_names::{ToolNames, ANTHROPIC_MAX_CHARS};

/// A checked request.
#[derive(Debug)]
pub(super) struct MessagesRequest {
    pub(super) spec: JobSpec,
}

/// What the body is for: a reply, or only its prompt's token count
/// (`/v1/messages/count_tokens`, where `max_tokens` is not asked for).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Purpose {
    Reply,
    Count,
}

/// The body's fields (others, such as `model`, `context_management` or
/// `output_config`, are ignored); the lists of blocks are walked by hand.
#[derive(Debug, Deserialize)]
struct Body {
    max_tokens: Option<Int>,
    temperature: Option<Num>,
    top_p: Option<Num>,
    top_k: Option<Int>,
    stream: Option<Flag>,
    stop_sequences: Option<List<Text>>,
    metadata: Option<Metadata>,
    system: Option<Value>,
    messages: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

/// `metadata`: `user_id` names who asks, for the per-requester metrics.
#[derive(Debug, Deserialize)]
struct Metadata {
    user_id: Option<Text>,
}

/// Parse and check a `/v1/messages` body.
pub(super) fn parse(
    body: &[u8],
    defaults: &SamplingParams,
    purpose: Purpose,
) -> Result<MessagesRequest, ApiError> {
    let v = json_in::body(body)?;
    let b: Body = json_in::read(&v)?;
    let max_tokens = match (b.max_tokens, purpose) {
        (Some(n), _) => n.0,
        (None, Purpose::Count) => 1,
        (None, Purpose::Reply) => {
            return Err(ApiError::at(
                "max_tokens",
                "max_tokens is required: the most tokens to generate",
            ))
        }
    };
    let stops: Vec<String> = b
        .stop_sequences
        .map_or_else(Vec::new, |l| l.0.into_iter().map(|t| t.0).collect());
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::at(
            "stop_sequences",
            format!(
                "stop_sequences has {}: give at most {MAX_STOP_STRINGS}",
                stops.len()
            ),
        ));
    }
    let messages = conversation(b.system.as_ref(), b.messages.as_ref())?;
    let (tools, choice) = tools(b.tools.as_ref(), b.tool_choice.as_ref())?;
    let common = Common {
        max_tokens: Some(max_tokens),
        temperature: b.temperature.map(|n| n.0),
        top_p: b.top_p.map(|n| n.0),
        top_k: b.top_k.map(|n| n.0),
        stop: Some(StopIn::Many(stops)),
        stream: b.stream.is_some_and(|f| f.0),
        user: b.metadata.and_then(|m| m.user_id).map(|t| t.0),
        ..Common::default()
    };
    let prompt = PromptSpec::Chat {
        messages,
        tools,
        options: thinking(b.thinking.as_ref())?,
    };
    let offered = prompt.tools().is_some();
    let mut spec = common.into_spec(prompt, defaults)?;
    spec.count_only = purpose == Purpose::Count;
    spec.constraint = Constraint::of(choice, offered, Constraint::None);
    Constraint::check(&spec)?;
    Ok(MessagesRequest { spec })
}

/// `system` and `messages` as chat messages: the system texts (`system`,
/// then `system`-role entries of `messages`) joined into one leading
/// system message.
fn conversation(system: Option<&Value>, list: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let mut system_texts = system_text(system)?;
    let list = match list {
        Some(Value::Array(l)) if !l.is_empty() => l,
        Some(Value::Array(_)) => {
            return Err(ApiError::at(
                "messages",
                "messages is empty: give at least one message",
            ))
        }
        None | Some(Value::Null) => return Err(ApiError::at("messages", "messages is required")),
        Some(v) => {
            return Err(ApiError::at(
                "messages",
                format!("messages must be an array of messages, not {}", kind(v)),
            ))
        }
    };
    let mut messages = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        match system_entry(&path, m)? {
            Some(text) => system_texts.push(text),
            None => message(&path, m, &mut messages)?,
        }
    }
    if messages.is_empty() {
        return Err(ApiError::at(
            "messages",
            "messages holds only system entries: give at least one user message",
        ));
    }
    if !system_texts.is_empty() {
        messages.insert(0, Message::new("system", &system_texts.join("\n\n")));
    }
    Ok(messages)
}

/// A `system`-role entry of `messages` (as Claude Code sends one): its
/// text, folded into the system prompt in order; None for other roles.
fn system_entry(path: &str, v: &Value) -> Result<Option<String>, ApiError> {
    let m = object(v, path)?;
    if m.get("role").and_then(Value::as_str) != Some("system") {
        return Ok(None);
    }
    let content = format!("{path}.content");
    text_of(m.get("content"), &content, "text blocks").map(Some)
}

/// `thinking` as the chat template's reasoning switch (`enable_thinking`,
/// which templates without one ignore): `enabled` turns it on, `disabled`
/// off, `adaptive` leaves the template's default.
fn thinking(v: Option<&Value>) -> Result<crate::chat::TemplateOptions, ApiError> {
    let mut options = crate::chat::TemplateOptions::new();
    let t = match v {
        None | Some(Value::Null) => return Ok(options),
        Some(v) => object(v, "thinking")?,
    };
    match string(t, "type", "thinking")? {
        "enabled" => drop(options.insert("enable_thinking".into(), true.into())),
        "disabled" => drop(options.insert("enable_thinking".into(), false.into())),
        "adaptive" => {}
        other => {
            return Err(ApiError::at(
                "thinking",
                format!("thinking.type {other:?}: use enabled, adaptive or disabled"),
            ))
        }
    }
    Ok(options)
}

/// `system`'s text (a string or text blocks), if given; an empty list of
/// blocks is none (the template's own default system prompt stays, as for
/// null).
fn system_text(system: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let text = match system {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(blocks)) if blocks.is_empty() => return Ok(Vec::new()),
        v => text_of(v, "system", "text blocks")?,
    };
    Ok(vec![text])
}

fn unsupported(path: &str, kind: &str, takes: &str) -> ApiError {
    ApiError::at(
        path,
        format!(
            "{path}: blocks of type {kind:?} are not supported here; this server takes {takes}"
        ),
    )
}

/// One Anthropic message as chat messages: a user message's `tool_result`
/// blocks each become a `tool` message (in order, with its text around them),
/// an assistant message's `tool_use` blocks its `tool_calls`.
fn message(path: &str, v: &Value, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let m = object(v, path)?;
    let role = string(m, "role", path)?;
    if role != "user" && role != "assistant" {
        return Err(ApiError::at(
            path,
            format!("{path}.role is {role:?}: use user, assistant or system"),
        ));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(Message::new(role, s));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        None | Some(Value::Null) => {
            return Err(ApiError::at(path, format!("{path}.content is required")))
        }
        Some(v) => {
            return Err(ApiError::at(
                path,
                format!(
                    "{path}.content must be a string or an array of blocks, not {}",
                    kind(v)
                ),
            ))
        }
    };
    if role == "assistant" {
        out.push(assistant(path, blocks)?);
        return Ok(());
    }
    let mut text: Vec<&str> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let path = format!("{path}.content[{i}]");
        let b = object(b, &path)?;
        match string(b, "type", &path)? {
            "text" => text.push(string(b, "text", &path)?),
            "tool_result" => {
                if !text.is_empty() {
                    out.push(Message::new("user", &text.join("\n")));
                    text.clear();
                }
                out.push(tool_result(&path, b)?);
            }
            other => {
                return Err(unsupported(
                    &path,
                    other,
                    "text and tool_result blocks in user messages",
                ))
            }
        }
    }
    if !text.is_empty() || blocks.is_empty() {
        out.push(Message::new("user", &text.join("\n")));
    }
    Ok(())
}

/// An assistant message: its text blocks joined, its `tool_use` blocks as
/// OpenAI-shaped `tool_calls` (the input object as the arguments).
fn assistant(path: &str, blocks: &[Value]) -> Result<Message, ApiError> {
    let (mut text, mut calls, mut reasoning) = (Vec::new(), Vec::new(), Vec::new());
    for (i, b) in blocks.iter().enumerate() {
        let path = format!("{path}.content[{i}]");
        let b = object(b, &path)?;
        match string(b, "type", &path)? {
            "text" => text.push(string(b, "text", &path)?),
            // Earlier reasoning goes back to the template as such; redacted
            // reasoning (encrypted by Anthropic) means nothing here.
            "thinking" => reasoning.push(string(b, "thinking", &path)?),
            "redacted_thinking" => {}
            "tool_use" => {
                let input = match b.get("input") {
                    None | Some(Value::Null) => json!({}),
                    Some(v) => Value::Object(object(v, &format!("{path}.input"))?.clone()),
                };
                calls.push(json!({"id": string(b, "id", &path)?, "type": "function",
                    "function": {"name": string(b, "name", &path)?, "arguments": input}}));
            }
            other => {
                return Err(unsupported(
                    &path,
                    other,
                    "text, thinking and tool_use blocks in assistant messages",
                ))
            }
        }
    }
    let mut m = Message::new("assistant", &text.join("\n"));
    if !reasoning.is_empty() {
        m.extra
            .insert("reasoning_content".into(), json!(reasoning.join("\n")));
    }
    if !calls.is_empty() {
        m.extra.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(m)
}

/// A `tool_result` block as a `tool` message answering its call.
fn tool_result(path: &str, b: &Obj) -> Result<Message, ApiError> {
    let id = string(b, "tool_use_id", path)?;
    let path = format!("{path}.content");
    let content = text_of(b.get("content"), &path, "text blocks in tool results")?;
    let content = match b.get("is_error") {
        Some(Value::Bool(true)) => format!("Error: {content}"),
        _ => content,
    };
    let mut m = Message::new("tool", &content);
    m.extra.insert("tool_call_id".into(), json!(id));
    Ok(m)
}

/// The tools as the chat template expects them (OpenAI-shaped functions), or
/// None when none are given or `tool_choice` is none; the choice among them.
fn tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<(Option<Value>, ToolChoice), ApiError> {
    let list = match tools {
        None | Some(Value::Null) => {
            return tool_choice(choice, &[]).map(|_| (None, ToolChoice::Auto))
        }
        Some(Value::Array(l)) => l,
        Some(v) => {
            return Err(ApiError::at(
                "tools",
                format!("tools must be an array of tools, not {}", kind(v)),
            ))
        }
    };
    let mut names = ToolNames::new(ANTHROPIC_MAX_CHARS);
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let t = object(t, &path)?;
        if let Some(kind) = t
            .get("type")
            .and_then(Value::as_str)
            .filter(|&k| k != "custom")
        {
            // Anthropic's server tools (web search, ...) run on its servers:
            // a local model cannot, so they are left out (said at -v).
            tracing::info!("{path}: a tool of type {kind:?} (one of Anthropic's server tools) left out: a local model cannot serve it");
            continue;
        }
        let name = names
            .take(&format!("{path}.name"), t.get("name"))
            .map_err(|m| ApiError::at(&path, m))?;
        let schema = match t.get("input_schema") {
            Some(Value::Object(s)) => Value::Object(s.clone()),
            None | Some(Value::Null) => {
                return Err(ApiError::at(
                    &path,
                    format!("{path}.input_schema is required"),
                ))
            }
            Some(v) => {
                return Err(ApiError::at(
                    &path,
                    format!(
                        "{path}.input_schema must be a JSON schema object, not {}",
                        kind(v)
                    ),
                ))
            }
        };
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            function["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    let names: Vec<&str> = out
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    Ok(match tool_choice(choice, &names)? {
        Some(choice) if !out.is_empty() => (Some(Value::Array(out)), choice),
        _ => (None, ToolChoice::Auto),
    })
}

/// `tool_choice`: None for none (no tools offered); `any` forces a call to
/// one of the tools, `tool` to the one named.
fn tool_choice(choice: Option<&Value>, names: &[&str]) -> Result<Option<ToolChoice>, ApiError> {
    let bad = |m: String| ApiError::at("tool_choice", m);
    let c = match choice {
        None | Some(Value::Null) => return Ok(Some(ToolChoice::Auto)),
        Some(v) => object(v, "tool_choice")?,
    };
    match string(c, "type", "tool_choice")? {
        "auto" => Ok(Some(ToolChoice::Auto)),
        "any" if names.is_empty() => Err(bad(
            "tool_choice.type \"any\" needs tools to call: give the request's tools, or leave tool_choice out".into(),
        )),
        "any" => Ok(Some(ToolChoice::Required)),
        "none" => Ok(None),
        "tool" => {
            let name = string(c, "name", "tool_choice")?;
            if names.contains(&name) {
                Ok(Some(ToolChoice::Named(name.into())))
            } else {
                Err(bad(format!(
                    "tool_choice.name {name:?} is not one of the tools given"
                )))
            }
        }
        other => Err(bad(format!(
            "tool_choice.type {other:?}: use auto, any, tool or none"
        ))),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;

/// A string, or text blocks joined by newlines (None and null: empty);
/// `path` names the field in errors, `what` the blocks taken there.
fn text_of(v: Option<&Value>, path: &str, what: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let path = format!("{path}[{i}]");
                let b = object(b, &path)?;
                match string(b, "type", &path)? {
                    "text" => parts.push(string(b, "text", &path)?),
                    other => return Err(unsupported(&path, other, what)),
                }
            }
            Ok(parts.join("\n"))
        }
        Some(v) => Err(ApiError::at(
            path,
            format!("{path} must be a string or text blocks, not {}", kind(v)),
        )),
    }
}
