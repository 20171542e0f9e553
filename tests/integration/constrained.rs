//! Constrained decoding on a zoo model (random weights: only the grammar can
//! make its reply a valid call or valid JSON): `tool_choice` `required` (and
//! Anthropic's `any`) gives a call in each conformance family's own format
//! whose arguments validate against the tool's schema; `response_format` and
//! `text.format` give JSON that validates, the same streamed; a schema the
//! converter refuses is a 400 naming the part.

use serde_json::{json, Value};

use crate::common::zoo_model;
use crate::serve::{sse_data, Server};

/// The zoo model every test here serves (random weights).
fn model() -> String {
    zoo_model("qwen3moe", "f32")
}

fn template(file: &str) -> String {
    format!("{}/tests/data/templates/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// A tool schema whose every value is bounded (enums, ranges, booleans), so
/// a forced call is short whatever the weights.
fn weather() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"}},
        "required": ["city", "days", "metric"]})
}

/// `v` checked against `schema` with a JSON-schema validator.
fn assert_valid(schema: &Value, v: &Value, what: &str) {
    let validator = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{what}: {v} does not validate: {errors:?}"
    );
}

/// One server with `file`'s template: a forced call through the OpenAI chat
/// route (`required`) and the Anthropic route (`any`), each valid.
fn forced_calls(file: &str) {
    let t = template(file);
    let server = Server::start_on(model(), &["-c", "2048", "--chat-template-file", &t]);
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let chat = json!({"messages": user, "max_tokens": 320, "tool_choice": "required",
        "temperature": 0, "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "The weather", "parameters": weather()}}]});
    let (status, body) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{file}: {body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{file}: {body}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{file}: {body}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().expect("text"))
        .unwrap_or_else(|e| panic!("{file}: arguments are JSON: {e}: {body}"));
    assert_valid(&weather(), &args, &format!("{file} chat"));
    // Python-style calls' arguments go out whole; every other format's as written.
    let pieces_at_least = if file.starts_with("LFM") { 1 } else { 2 };
    let (name, pieces) = streamed_chat_call(&server, &chat, file);
    assert_eq!(name, "get_weather", "{file}");
    assert_eq!(
        pieces.concat(),
        call["arguments"].as_str().unwrap(),
        "{file}: {pieces:?}"
    );
    assert!(pieces.len() >= pieces_at_least, "{file}: {pieces:?}");

    let messages = json!({"messages": user, "max_tokens": 320, "tool_choice": {"type": "any"},
        "temperature": 0, "tools": [{"name": "get_weather", "description": "The weather",
            "input_schema": weather()}]});
    let (status, body) = server.post("/v1/messages", &messages);
    assert_eq!(status, 200, "{file}: {body}");
    assert_eq!(body["stop_reason"], "tool_use", "{file}: {body}");
    let used = body["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("{file}: a tool_use block: {body}"));
    assert_eq!(used["name"], "get_weather", "{file}: {body}");
    assert_valid(&weather(), &used["input"], &format!("{file} anthropic"));
    let (name, pieces) = streamed_tool_use(&server, &messages, file);
    assert_eq!(name, "get_weather", "{file}");
    let input: Value = serde_json::from_str(&pieces.concat()).expect("the input is JSON");
    assert_eq!(input, used["input"], "{file}: {pieces:?}");
    assert!(pieces.len() >= pieces_at_least, "{file}: {pieces:?}");
}

/// `body` with `stream: true` sent to `path`: the status, each event's
/// data as JSON, and the raw text.
fn stream_of(server: &Server, path: &str, body: &Value) -> (u16, Vec<Value>, String) {
    let mut body = body.clone();
    body["stream"] = true.into();
    let (status, text) = server.request("POST", path, &body.to_string(), &[]);
    let events = sse_data(&text)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    (status, events, text)
}

/// `body` streamed on the chat route: the call's name (in the chunk that
/// starts it) and its arguments' pieces, each in a chunk of its own after it.
fn streamed_chat_call(server: &Server, body: &Value, file: &str) -> (String, Vec<String>) {
    let (status, events, text) = stream_of(server, "/v1/chat/completions", body);
    assert_eq!(status, 200, "{file}: {text}");
    let (mut name, mut pieces) = (None, Vec::new());
    for chunk in &events {
        let Some(call) = chunk["choices"][0]["delta"]["tool_calls"].get(0) else {
            continue;
        };
        assert_eq!(call["index"], 0, "{file}: one call: {text}");
        if let Some(n) = call["function"]["name"].as_str() {
            assert!(name.is_none(), "{file}: named once: {text}");
            name = Some(n.to_string());
        }
        let args = call["function"]["arguments"].as_str().unwrap_or("");
        assert!(name.is_some(), "{file}: the name first: {text}");
        if !args.is_empty() {
            pieces.push(args.to_string());
        }
    }
    (
        name.unwrap_or_else(|| panic!("{file}: a streamed call: {text}")),
        pieces,
    )
}

/// `body` streamed on the Anthropic route: the `tool_use` block's name and
/// its `input_json_delta` pieces.
fn streamed_tool_use(server: &Server, body: &Value, file: &str) -> (String, Vec<String>) {
    let (status, events, text) = stream_of(server, "/v1/messages", body);
    assert_eq!(status, 200, "{file}: {text}");
    let start = events
        .iter()
        .find(|e| e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{file}: a tool_use block: {text}"));
    let pieces = events
        .iter()
        .filter(|e| e["index"] == start["index"] && e["delta"]["type"] == "input_json_delta")
        .map(|e| {
            e["delta"]["partial_json"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let name = start["content_block"]["name"].as_str().unwrap_or("");
    (name.to_string(), pieces)
}

macro_rules! forced_call_tests {
    ($($name:ident: $file:literal;)*) => {$(
        #[test]
        fn $name() {
            forced_calls($file);
        }
    )*};
}

forced_call_tests! {
    gpt_oss_forces_a_harmony_call: "openai-gpt-oss-120b.jinja";
    qwen3_forces_a_hermes_call: "Qwen-Qwen3-0.6B.jinja";
    qwen3_coder_forces_an_xml_call: "Qwen3-Coder.jinja";
    qwen35_forces_an_xml_call: "Qwen3.5-4B.jinja";
    deepseek_v31_forces_a_call: "deepseek-ai-DeepSeek-V3.1.jinja";
    deepseek_v32_forces_a_dsml_call: "deepseek-ai-DeepSeek-V3.2.jinja";
    kimi_k2_forces_a_section_call: "moonshotai-Kimi-K2.jinja";
    kimi_k2_thinking_forces_a_section_call: "Kimi-K2-Thinking.jinja";
    nemotron_nano_v2_forces_a_json_list_call: "NVIDIA-Nemotron-Nano-v2.jinja";
    nemotron_3_nano_forces_an_xml_call: "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja";
    mistral_small_31_forces_a_call: "mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja";
    mistral_small_32_forces_a_call: "Mistral-Small-3.2-24B-Instruct-2506.jinja";
    glm_46_forces_an_arg_key_call: "GLM-4.6.jinja";
    glm_47_flash_forces_an_arg_key_call: "GLM-4.7-Flash.jinja";
    minimax_m2_forces_an_invoke_call: "MiniMax-M2.jinja";
    lfm25_forces_a_pythonic_call: "LFM2.5-8B-A1B.jinja";
}

/// Nested objects, an array, enums and required fields, all bounded.
fn order() -> Value {
    json!({"type": "object", "properties": {
        "kind": {"type": "string", "enum": ["pizza", "soup"]},
        "size": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 3},
            "large": {"type": "boolean"}}, "required": ["n", "large"]},
        "extras": {"type": "array", "items": {"type": "string", "enum": ["cheese", "basil"]},
            "minItems": 1, "maxItems": 2}},
        "required": ["kind", "size", "extras"]})
}

/// `response_format` json_schema: whole, greedy and sampled, valid; streamed,
/// the same content; `text.format` on the Responses route, valid; refused
/// schemas and tools, a 400 naming the part.
#[test]
fn structured_output_validates_whole_streamed_and_on_responses() {
    let server = Server::start_on(model(), &["-c", "512"]);
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "order", "strict": true, "schema": order()}});
    let ask = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Order food"}],
            "max_tokens": 120, "response_format": format});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let (status, body) = server.post("/v1/chat/completions", &ask(json!({})));
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_valid(&order(), &v, "greedy");

    let (_, text) = server.request(
        "POST",
        "/v1/chat/completions",
        &ask(json!({"stream": true})).to_string(),
        &[],
    );
    let streamed: String = sse_data(&text)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, content);

    let sampled = ask(json!({"temperature": 0.9, "seed": 7}));
    let (status, body) = server.post("/v1/chat/completions", &sampled);
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_valid(&order(), &v, "sampled");

    let (status, body) = server.post(
        "/v1/responses",
        &json!({"input": "Order food", "max_output_tokens": 120,
            "text": {"format": {"type": "json_schema", "name": "order", "schema": order()}}}),
    );
    assert_eq!(status, 200, "{body}");
    let text = body["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "message"))
        .map(|m| {
            m["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_else(|| panic!("a message: {body}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_valid(&order(), &v, "responses");

    let refused = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}});
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": refused}}}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("at /properties/a"), "{message}");
    let (status, body) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": refused}}]}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "tools", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("tools[0] (f) parameters:"), "{message}");
}

/// Under `auto` the grammar is lazy: the agent fixture's reply (`Hello`)
/// stays text; `required`, a named function and the Responses route's
/// `required` override those weights with a call.
#[test]
fn auto_leaves_text_possible_and_a_forced_call_overrides_the_weights() {
    let m = crate::common::agent_model().to_str().unwrap().to_string();
    let server = Server::start_on(&m, &["-c", "1024"]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": weather()}}]);
    let chat = |choice: Value| {
        let (status, body) = server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 200,
                "tools": tools, "tool_choice": choice}),
        );
        assert_eq!(status, 200, "{body}");
        body["choices"][0].clone()
    };
    let auto = chat(json!("auto"));
    assert_eq!(auto["message"]["content"], "Hello", "{auto}");
    assert!(auto["message"].get("tool_calls").is_none(), "{auto}");
    for forced in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let c = chat(forced);
        let call = &c["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather", "{c}");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_valid(&weather(), &args, "agent chat");
    }
    let streamed = json!({"messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 200, "tools": tools, "tool_choice": "required", "stream": true});
    let (_, text) = server.request("POST", "/v1/chat/completions", &streamed.to_string(), &[]);
    let call = sse_data(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .unwrap_or_else(|| panic!("a streamed call: {text}"));
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    let responses = json!({"input": "Weather?", "max_output_tokens": 200, "temperature": 0,
        "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "parameters": weather()}]});
    let (status, body) = server.post("/v1/responses", &responses);
    assert_eq!(status, 200, "{body}");
    let call = body["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("a function_call item: {body}"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_valid(&weather(), &args, "agent responses");
    // Streamed: the item is added (named) first, its arguments come in pieces.
    let (_, events, text) = stream_of(&server, "/v1/responses", &responses);
    let added = events
        .iter()
        .position(|e| {
            e["type"] == "response.output_item.added" && e["item"]["type"] == "function_call"
        })
        .unwrap_or_else(|| panic!("a function_call item added: {text}"));
    assert_eq!(events[added]["item"]["name"], "get_weather", "{text}");
    let pieces: Vec<&str> = events[added..]
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert!(pieces.len() >= 2, "{text}");
    assert_eq!(
        pieces.concat(),
        call["arguments"].as_str().unwrap(),
        "{text}"
    );
}
