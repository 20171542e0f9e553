//! Replies as the models write them (calls, text around them, and broken
//! calls), whole and streamed in small pieces.

use serde_json::{json, Value};

use super::*;

fn args(c: &ToolCall) -> Value {
    serde_json::from_str(&c.arguments).expect("arguments are JSON")
}

/// The reply streamed in pieces of `n` bytes (on char boundaries): the
/// content handed out along the way plus the rest, and the split.
fn streamed(format: CallFormat, text: &str, n: usize) -> (String, Parsed) {
    let mut s = CallStream::new(format);
    let mut out = String::new();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + n).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push_str(&s.push(&text[at..end]));
        at = end;
    }
    let (rest, _, parsed) = s.finish();
    out.push_str(&rest);
    (out, parsed)
}

/// Whole and streamed (in several piece sizes) agree.
fn both(format: CallFormat, text: &str) -> Parsed {
    let whole = parse(format, text);
    for n in [1, 3, 7, 64] {
        let (content, parsed) = streamed(format, text, n);
        assert_eq!(content, whole.content, "streamed by {n}: {text:?}");
        assert_eq!(parsed.calls.len(), whole.calls.len());
    }
    whole
}

const QWEN3: &str = "<think>\nThe user wants the weather in Paris and Tokyo.\n</think>\n\nI'll check both cities.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call>";

#[test]
fn hermes_calls_are_split_from_the_text() {
    let p = both(CallFormat::Hermes, QWEN3);
    assert_eq!(
        p.content,
        "<think>\nThe user wants the weather in Paris and Tokyo.\n</think>\n\nI'll check both cities."
    );
    assert_eq!(p.calls.len(), 2);
    assert_eq!(p.calls[0].name, "get_weather");
    assert_eq!(
        args(&p.calls[0]),
        json!({"city": "Paris", "unit": "celsius"})
    );
    assert_eq!(args(&p.calls[1]), json!({"city": "Tokyo"}));
    assert_ne!(p.calls[0].id, p.calls[1].id);
    assert!(p.calls[0].id.starts_with("call_") && p.calls[0].id.len() == 29);
}

#[test]
fn hermes_arguments_as_text_or_missing_are_taken() {
    let p = both(
        CallFormat::Hermes,
        "<tool_call>\n{\"name\": \"now\"}\n</tool_call><tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
    );
    assert_eq!(p.content, "");
    assert_eq!(p.calls[0].arguments, "{}");
    assert_eq!(args(&p.calls[1]), json!({"x": 1}));
}

#[test]
fn broken_hermes_calls_stay_text() {
    let bad_json = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\n</tool_call>";
    let p = both(CallFormat::Hermes, bad_json);
    assert_eq!((p.content.as_str(), p.calls.len()), (bad_json, 0));
    let unclosed =
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
    let p = both(CallFormat::Hermes, unclosed);
    assert_eq!((p.content.as_str(), p.calls.len()), (unclosed, 0));
    let no_name = "<tool_call>{\"arguments\": {}}</tool_call> then <tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>";
    let p = both(CallFormat::Hermes, no_name);
    assert_eq!(p.content, "<tool_call>{\"arguments\": {}}</tool_call> then");
    assert_eq!(p.calls[0].name, "ok");
}

#[test]
fn plain_replies_pass_unchanged_and_a_lone_angle_bracket_is_released() {
    for f in [
        CallFormat::Hermes,
        CallFormat::XmlFunction,
        CallFormat::Harmony,
        CallFormat::None,
    ] {
        let text = "x < y and a <tool but not a call.\n\n";
        let p = both(f, text);
        assert_eq!((p.content.as_str(), p.calls.len()), (text, 0), "{f:?}");
    }
}

const CODER: &str = "I'll look that up.\n<tool_call>\n<function=search_files>\n<parameter=pattern>\n*.rs\n</parameter>\n<parameter=max_results>\n20\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n<parameter=query>\nfn main() {\n    println!(\"hi\");\n}\n</parameter>\n</function>\n</tool_call>";

#[test]
fn xml_function_calls_take_their_parameters() {
    let p = both(CallFormat::XmlFunction, CODER);
    assert_eq!(p.content, "I'll look that up.");
    assert_eq!(p.calls[0].name, "search_files");
    let a = args(&p.calls[0]);
    assert_eq!(a["pattern"], "*.rs");
    assert_eq!(a["max_results"], 20);
    assert_eq!(a["query"], "fn main() {\n    println!(\"hi\");\n}");
    let tools = json!([{"type": "function", "function": {"name": "search_files",
        "parameters": {"type": "object", "properties": {"zip": {"type": "string"}}}}}]);
    let typed = parse_with_tools(CallFormat::XmlFunction, CODER, Some(&tools));
    assert_eq!(
        args(&typed.calls[0])["zip"],
        "01234",
        "the schema says string"
    );
}

#[test]
fn broken_xml_function_calls_stay_text() {
    for bad in [
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>",
    ] {
        let p = both(CallFormat::XmlFunction, bad);
        assert_eq!((p.content.as_str(), p.calls.len()), (bad, 0), "{bad:?}");
    }
}

const GPT_OSS: &str = "<|channel|>analysis<|message|>User asks weather in Paris. Use get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";

#[test]
fn harmony_calls_reasoning_and_final_text_are_told_apart() {
    let p = both(CallFormat::Harmony, GPT_OSS);
    assert_eq!(p.content, "");
    assert_eq!(
        p.reasoning.as_deref(),
        Some("User asks weather in Paris. Use get_weather.")
    );
    assert_eq!(p.calls[0].name, "get_weather");
    assert_eq!(args(&p.calls[0]), json!({"city": "Paris"}));
    let answer = "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
    let p = both(CallFormat::Harmony, answer);
    assert_eq!(p.content, "Hello! How can I help?");
    assert_eq!(p.reasoning.as_deref(), Some("Simple greeting."));
    let header_first = "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}<|call|>";
    assert_eq!(
        both(CallFormat::Harmony, header_first).calls[0].name,
        "lookup"
    );
}

#[test]
fn broken_harmony_calls_stay_text() {
    let bad = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":<|call|>";
    let p = both(CallFormat::Harmony, bad);
    assert_eq!((p.content.as_str(), p.calls.len()), (bad, 0));
    let cut = "<|channel|>final<|message|>Hi<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>{\"a\": 1";
    let p = both(CallFormat::Harmony, cut);
    assert!(p.calls.is_empty());
    assert!(
        p.content.starts_with("Hi") && p.content.ends_with("{\"a\": 1"),
        "{p:?}"
    );
}

#[test]
fn formats_are_detected_from_the_templates() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/");
    let of = |name: &str| {
        let src = std::fs::read_to_string(format!("{dir}{name}.jinja")).expect("template");
        CallFormat::detect(&src)
    };
    assert_eq!(of("Qwen-Qwen3-0.6B"), CallFormat::Hermes);
    for xml in [
        "Qwen3-Coder",
        "Qwen3.5-4B",
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    ] {
        assert_eq!(of(xml), CallFormat::XmlFunction, "{xml}");
    }
    assert_eq!(of("openai-gpt-oss-120b"), CallFormat::Harmony);
    // Every family of the suite has its format (tests_families); a template
    // that reads tools but shows no call markers writes text.
    let plain = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}";
    assert_eq!(CallFormat::detect(plain), CallFormat::None);
}

#[test]
fn partial_markers_are_found() {
    assert_eq!(partial_marker("abc <tool", OPEN), 5);
    assert_eq!(partial_marker("abc <", OPEN), 1);
    assert_eq!(partial_marker("abc", OPEN), 0);
    assert_eq!(partial_marker("é<tool_cal", OPEN), 9);
    // A marker cut inside one of its multi-byte chars is no partial marker.
    let ds = "<｜tool▁calls▁begin｜>";
    assert_eq!(partial_marker("abc <\u{ff5c}", ds), 4);
    assert_eq!(partial_marker("abc <", ds), 1);
}
