//! The conformance suite: real chat templates of MoE families (test data
//! under tests/data/templates, source and license in its manifest.json),
//! each rendered on a fixed set of conversations through the renderer every
//! command uses, byte for byte against what Python jinja2 configured as
//! transformers renders (expected.json, made by tests/data/templates/render.py).

use std::path::PathBuf;

use chrono::TimeZone;
use serde::Deserialize;

use super::{ChatInput, ChatTemplate, Message, TemplateOptions};

#[derive(Deserialize)]
struct Manifest {
    today: String,
    templates: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    file: String,
    bos: String,
    eos: String,
}

#[derive(Deserialize)]
struct Conversations {
    tools: serde_json::Value,
    conversations: Vec<Conversation>,
}

#[derive(Deserialize)]
struct Conversation {
    name: String,
    messages: Vec<Message>,
    #[serde(default)]
    tools: bool,
    add_generation_prompt: Option<bool>,
}

/// What the reference renderer made of one template and conversation.
#[derive(Deserialize)]
struct Expected {
    text: Option<String>,
    error: Option<String>,
}

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/templates")
}

fn load<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let text = std::fs::read_to_string(data().join(name)).expect("conformance data");
    serde_json::from_str(&text).expect("conformance data is JSON")
}

#[test]
fn every_real_template_renders_as_transformers_does() {
    let manifest: Manifest = load("manifest.json");
    let convs: Conversations = load("conversations.json");
    let expected: std::collections::HashMap<String, std::collections::HashMap<String, Expected>> =
        load("expected.json");
    let day = chrono::NaiveDate::parse_from_str(&manifest.today, "%Y-%m-%d").unwrap();
    let now = chrono::Utc.from_utc_datetime(&day.and_hms_opt(10, 30, 0).unwrap());
    let options = TemplateOptions::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for entry in &manifest.templates {
        let source = std::fs::read_to_string(data().join(&entry.file)).unwrap();
        let t = ChatTemplate::new(Some(source.clone()), &entry.bos, &entry.eos).at(now);
        // `render` describes tools itself only to a template that knows none;
        // each of these knows them, so `render` is `render_jinja` for them.
        assert!(t.reads_tools(), "{}: knows tools", entry.file);
        for conv in &convs.conversations {
            let want = &expected[&entry.file][&conv.name];
            let input = ChatInput {
                messages: &conv.messages,
                tools: conv.tools.then_some(&convs.tools),
                options: &options,
                add_generation_prompt: conv.add_generation_prompt.unwrap_or(true),
            };
            let got = t.render_jinja(&source, &input);
            checked += 1;
            match (&got, &want.text, &want.error) {
                (Ok(g), Some(w), _) if g == w => {}
                (Err(_), None, Some(_)) => {}
                _ => failures.push(format!(
                    "{} / {}:\n  bmoe:      {:?}\n  reference: {:?}",
                    entry.file,
                    conv.name,
                    got.map_err(|e| e.to_string()),
                    want.text.as_ref().ok_or(&want.error)
                )),
            }
        }
    }
    assert!(checked >= 16 * 7, "{checked} cases");
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A long conversation: a system message, `turns` user/assistant exchanges
/// of a few hundred characters each, a tool round when `tool_round` is
/// given (its assistant call and tool reply), and a last user message.
fn long_conversation(turns: usize, tool_round: Option<&[Message]>) -> Vec<Message> {
    let text = "The experts of each layer stream from flash as the router picks them. ".repeat(6);
    let mut messages = vec![Message::new("system", "You are a careful assistant.")];
    for i in 0..turns {
        messages.push(Message::new("user", &format!("Question {i}: {text}")));
        messages.push(Message::new("assistant", &format!("Answer {i}: {text}")));
    }
    match tool_round {
        Some(round) => messages.extend(round.iter().cloned()),
        None => messages.push(Message::new("user", "And now?")),
    }
    messages
}

/// The limits leave every real template ten times the room a long
/// conversation with tools takes: rendered within a tenth of the step budget,
/// the prompt is the one rendered without limits, well under the output limit.
#[test]
fn every_real_template_renders_a_long_conversation_within_a_tenth_of_the_limits() {
    use super::sandbox::render_with_fuel;
    use super::sandbox::{OUTPUT_LIMIT_BYTES, STEP_BUDGET};
    let manifest: Manifest = load("manifest.json");
    let convs: Conversations = load("conversations.json");
    let round = &convs
        .conversations
        .iter()
        .find(|c| c.name == "tool_round")
        .expect("a tool round")
        .messages;
    let options = TemplateOptions::new();
    let mut rendered = 0;
    for entry in &manifest.templates {
        let source = std::fs::read_to_string(data().join(&entry.file)).unwrap();
        let t = ChatTemplate::new(Some(source.clone()), &entry.bos, &entry.eos);
        for tools in [None, Some(round.as_slice())] {
            let messages = long_conversation(100, tools);
            let input = ChatInput {
                messages: &messages,
                tools: Some(&convs.tools),
                options: &options,
                add_generation_prompt: true,
            };
            let job = t.job(&source, &input);
            let Ok(free) = render_with_fuel(&job, 1 << 60) else {
                // Kimi-K2-Thinking and Mistral 3.2 refuse this tool round
                // without limits too (see expected.json).
                assert!(tools.is_some(), "{}: renders without limits", entry.file);
                continue;
            };
            let limited = render_with_fuel(&job, STEP_BUDGET / 10)
                .unwrap_or_else(|e| panic!("{}: {e:?}", entry.file));
            assert_eq!(limited, free, "{}", entry.file);
            assert!((limited.len() as u64) < OUTPUT_LIMIT_BYTES / 10);
            assert!(limited.len() > 100 * 2 * 400, "{}: long", entry.file);
            rendered += 1;
        }
    }
    assert!(rendered >= 16 + 14, "{rendered} renders");
}
