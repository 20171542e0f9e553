//! Replies streamed as they are produced, on the thinker fixture (every
//! reply `Hello</think>Sure`) under a ChatML template whose generation
//! prompt opens `<think>`, as GLM-4.7's and the thinking Qwen3s' do: the
//! reasoning (`Hello`) streams before the answer (`Sure`) on the OpenAI
//! chat and Anthropic routes, whole replies split the same way, and a
//! request that turns thinking off gets the template's switch.

use serde_json::{json, Value};

use super::common::thinker_model;
use super::serve::{chat_body, sse_data, Server};

/// ChatML whose generation prompt opens a reasoning block unless
/// `enable_thinking` is false (then an empty, closed one), and whose
/// earlier assistant turns carry their reasoning.
const THINKING_TEMPLATE: &str = "{%- for m in messages %}<|im_start|>{{ m.role }}\n\
{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}\
{{ m.content }}<|im_end|>\n{% endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n\
{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n\
{%- else %}<think>\n{% endif %}{% endif %}";

fn thinker() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("thinking.jinja");
    std::fs::write(&t, THINKING_TEMPLATE).unwrap();
    let server = Server::start_on(
        thinker_model(),
        &["-c", "512", "--chat-template-file", t.to_str().unwrap()],
    );
    (dir, server)
}

/// The named events of an Anthropic stream: (event, data).
fn named_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((name.clone(), serde_json::from_str(d).expect("JSON data")));
        }
    }
    out
}

#[test]
fn reasoning_streams_before_the_answer_on_the_chat_route() {
    let (_dir, server) = thinker();
    let body = chat_body("Hi", json!({"max_tokens": 16, "stream": true}));
    let (status, text) = server.request("POST", "/v1/chat/completions", &body.to_string(), &[]);
    assert_eq!(status, 200, "{text}");
    let deltas: Vec<Value> = sse_data(&text)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("JSON chunk"))
        .map(|c| c["choices"][0]["delta"].clone())
        .collect();
    let first_content = deltas
        .iter()
        .position(|d| d["content"].as_str().is_some_and(|c| !c.is_empty()))
        .unwrap_or_else(|| panic!("a content delta: {text}"));
    let reasoning: Vec<usize> = (0..deltas.len())
        .filter(|&i| deltas[i]["reasoning_content"].is_string())
        .collect();
    assert!(!reasoning.is_empty(), "reasoning deltas: {text}");
    assert!(reasoning.iter().all(|&i| i < first_content), "{text}");
    let joined = |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
    assert_eq!(
        (joined("reasoning_content"), joined("content")),
        ("Hello".into(), "Sure".into())
    );

    // Whole, the same split.
    let (status, v) = server.post(
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 16})),
    );
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["reasoning_content"], &m["content"]),
        (&json!("Hello"), &json!("Sure")),
        "{v}"
    );
}

#[test]
fn reasoning_streams_as_a_thinking_block_on_the_anthropic_route() {
    let (_dir, server) = thinker();
    let body = json!({"model": "m", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let (status, text) = server.request("POST", "/v1/messages", &body.to_string(), &[]);
    assert_eq!(status, 200, "{text}");
    let events = named_events(&text);
    let kind = |e: &(String, Value)| e.1["delta"]["type"].as_str().map(str::to_string);
    let first_text = events
        .iter()
        .position(|e| kind(e).as_deref() == Some("text_delta"))
        .unwrap_or_else(|| panic!("a text delta: {text}"));
    let thinking: Vec<usize> = (0..events.len())
        .filter(|&i| kind(&events[i]).as_deref() == Some("thinking_delta"))
        .collect();
    assert!(
        !thinking.is_empty() && thinking.iter().all(|&i| i < first_text),
        "{text}"
    );
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e.0 == "content_block_start")
        .map(|e| &e.1["content_block"]["type"])
        .collect();
    assert_eq!(starts, [&json!("thinking"), &json!("text")], "{text}");
    let thought: String = thinking
        .iter()
        .filter_map(|&i| events[i].1["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thought, "Hello");

    // Whole: a thinking block, then the text.
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let (status, v) = server.post("/v1/messages", &whole);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["content"][0],
        json!({"type": "thinking", "thinking": "Hello", "signature": ""}),
        "{v}"
    );
    assert_eq!(
        v["content"][1],
        json!({"type": "text", "text": "Sure"}),
        "{v}"
    );
}

/// Thinking turned off renders the template's closed block (the prompt
/// ends `</think>`): the model goes on from there with the answer alone,
/// one token (`Sure`) where thinking on makes five, and no reasoning.
#[test]
fn a_request_that_turns_thinking_off_gets_the_templates_switch() {
    let (_dir, server) = thinker();
    let (status, v) = server.post(
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 16, "reasoning_effort": "none"})),
    );
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{v}");
    assert_eq!(
        (&m["content"], &v["usage"]["completion_tokens"]),
        (&json!("Sure"), &json!(1)),
        "{v}"
    );
    let body = json!({"model": "m", "max_tokens": 16, "thinking": {"type": "disabled"},
                      "messages": [{"role": "user", "content": "Hi"}]});
    let (status, v) = server.post("/v1/messages", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Sure"}]),
        "{v}"
    );
    assert_eq!(v["usage"]["output_tokens"], 1, "{v}");
    let mut on = body.clone();
    on["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let (_, v) = server.post("/v1/messages", &on);
    assert_eq!(v["usage"]["output_tokens"], 5, "{v}");
}

#[test]
fn reasoning_streams_as_a_reasoning_item_on_the_responses_route() {
    let (_dir, server) = thinker();
    let body = json!({"model": "m", "max_output_tokens": 16, "stream": true, "input": "Hi"});
    let (status, text) = server.request("POST", "/v1/responses", &body.to_string(), &[]);
    assert_eq!(status, 200, "{text}");
    let events = named_events(&text);
    let at = |name: &str| events.iter().position(|e| e.0 == name);
    let (reasoning, answer) = (
        at("response.reasoning_text.delta"),
        at("response.output_text.delta"),
    );
    assert!(reasoning.is_some() && reasoning < answer, "{text}");
    let done = &events.last().expect("events").1["response"];
    assert_eq!(done["output"][0]["type"], "reasoning", "{done}");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello", "{done}");
    assert_eq!(done["output"][1]["content"][0]["text"], "Sure", "{done}");
}
