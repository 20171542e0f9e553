//! Tools for a chat template that knows nothing of them (it reads neither
//! `tools` nor `tool_calls`, or the model file carries no template): the tools are described in the system
//! message, with the Hermes way to call them (`<tool_call>{"name",
//! "arguments"}</tool_call>`, which [`super::tool_calls`] then parses), and
//! earlier calls and their results are written into the messages' text the
//! same way, since such a template would drop them.

use serde_json::Value;

use super::message::Message;

/// Whether a template knows tools: it reads the `tools` variable or writes
/// calls (`tool_calls`). One that writes calls but takes no tool list
/// (DeepSeek-V3.1 expects the caller to describe the tools in the system
/// message) is rendered as transformers renders it, tools left out.
pub(crate) fn reads_tools(source: &str) -> bool {
    source.contains("tools") || source.contains("tool_calls")
}

/// `messages` with the tools described in the system message (one added
/// first when there is none), assistant calls written as `<tool_call>` text
/// and tool results as user messages in `<tool_response>` tags.
pub(crate) fn describe(messages: &[Message], tools: &Value) -> Vec<Message> {
    let mut out: Vec<Message> = messages.iter().map(inline).collect();
    let text = instructions(tools);
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{text}", first.content.trim_end());
        }
        _ => out.insert(0, Message::new("system", &text)),
    }
    out
}

/// Whether `messages` hold calls or their results (which a template that
/// knows no tools would drop).
pub(crate) fn has_calls(messages: &[Message]) -> bool {
    messages
        .iter()
        .any(|m| m.role == "tool" || m.extra.contains_key("tool_calls"))
}

/// `messages` with calls and results written as text, no tools described
/// (a conversation that made calls, sent without its tools).
pub(crate) fn inline_calls(messages: &[Message]) -> Vec<Message> {
    messages.iter().map(inline).collect()
}

/// The system message's tool section.
fn instructions(tools: &Value) -> String {
    let list: Vec<String> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t.to_string())
        .collect();
    format!(
        "# Tools\n\nYou may call one or more functions to help with the user's request. \
         The functions, as JSON Schema, within <tools></tools> tags:\n<tools>\n{}\n</tools>\n\n\
         To call a function, reply with a JSON object of its name and arguments within \
         <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        list.join("\n")
    )
}

/// One message with its calls (assistant) or its result (tool) as text.
fn inline(m: &Message) -> Message {
    let mut out = m.clone();
    if m.role == "tool" {
        out.role = "user".into();
        out.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
        return out;
    }
    let calls = m.extra.get("tool_calls").and_then(Value::as_array);
    for call in calls.into_iter().flatten() {
        let f = &call["function"];
        let json = serde_json::json!({"name": f["name"], "arguments": f["arguments"]});
        if !out.content.is_empty() {
            out.content.push('\n');
        }
        out.content
            .push_str(&format!("<tool_call>\n{json}\n</tool_call>"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A question, the assistant's call of `get_weather`, its result.
    fn weather_call() -> [Message; 3] {
        let mut call = Message::new("assistant", "");
        call.extra.insert(
            "tool_calls".into(),
            serde_json::json!([{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]),
        );
        [
            Message::new("user", "Weather in Paris?"),
            call,
            Message::new("tool", "18C"),
        ]
    }

    /// Issue 64, finding 9: calls sent without tools stay in the prompt.
    #[test]
    fn calls_without_tools_are_text_too() {
        let msgs = weather_call();
        assert!(has_calls(&msgs) && !has_calls(&msgs[..1]));
        let out = inline_calls(&msgs);
        assert_eq!(out.len(), 3, "no tool section added");
        assert!(out[1].content.contains("get_weather"), "{}", out[1].content);
        assert!(out[2].content.contains("18C") && out[2].role == "user");
    }

    #[test]
    fn tools_calls_and_results_become_text() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let msgs = weather_call();
        let out = describe(&msgs, &tools);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(
            out[0].content.contains(r#""name":"get_weather""#),
            "{}",
            out[0].content
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n18C\n</tool_response>")
        );
        let with_system = describe(&[Message::new("system", "Be brief.")], &tools);
        assert_eq!(with_system.len(), 1);
        assert!(with_system[0].content.starts_with("Be brief.\n\n# Tools"));
    }
}
