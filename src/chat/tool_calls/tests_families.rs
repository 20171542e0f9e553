//! Every conformance template's family: its format detected from the
//! template, and a reply with calls rendered through the template itself
//! (an assistant message with `tool_calls`) parsed back to the same calls,
//! whole and streamed in random pieces; broken calls stay text.

use std::path::PathBuf;

use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{json, Value};

use super::*;
use crate::chat::{ChatInput, ChatTemplate, Message, TemplateOptions};

#[derive(Deserialize)]
struct Entry {
    file: String,
    family: String,
    bos: String,
    eos: String,
}

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/templates")
}

fn entries() -> Vec<Entry> {
    let text = std::fs::read_to_string(data().join("manifest.json")).expect("manifest");
    let v: Value = serde_json::from_str(&text).expect("manifest is JSON");
    serde_json::from_value(v["templates"].clone()).expect("templates")
}

pub(super) fn tools() -> Value {
    let text = std::fs::read_to_string(data().join("conversations.json")).expect("conversations");
    let v: Value = serde_json::from_str(&text).expect("conversations are JSON");
    v["tools"].clone()
}

/// The format each family's template writes calls in.
fn expected_format(family: &str) -> CallFormat {
    match family {
        "gpt-oss" => CallFormat::Harmony,
        "Qwen3" => CallFormat::Hermes,
        "Qwen3-Coder" | "Qwen3.5" | "Nemotron-3-Nano" => CallFormat::XmlFunction,
        "DeepSeek-V3.1" => CallFormat::DeepSeek,
        "DeepSeek-V3.2" => CallFormat::Dsml,
        "Kimi-K2" | "Kimi-K2-Thinking" => CallFormat::Kimi,
        "Nemotron-Nano-v2" => CallFormat::JsonList,
        "Mistral-Small-3.1" | "Mistral-Small-3.2" => CallFormat::Mistral,
        "GLM-4.6" | "GLM-4.7-Flash" => CallFormat::Glm,
        "MiniMax-M2" => CallFormat::MiniMax,
        "LFM2.5" => CallFormat::Pythonic,
        other => panic!("no format known for family {other}"),
    }
}

fn source(e: &Entry) -> String {
    std::fs::read_to_string(data().join(&e.file)).expect("template")
}

#[test]
fn each_conformance_template_detects_its_familys_format() {
    let entries = entries();
    assert_eq!(entries.len(), 16);
    for e in &entries {
        let got = CallFormat::detect(&source(e));
        assert_eq!(got, expected_format(&e.family), "{}", e.file);
    }
}

/// The calls the assistant message makes.
fn the_calls() -> Vec<(&'static str, Value)> {
    vec![
        ("get_weather", json!({"city": "Paris", "unit": "celsius"})),
        ("get_weather", json!({"city": "Tokyo"})),
    ]
}

/// `calls` as an assistant message's `tool_calls` (ids of 9 alphanumerics,
/// as Mistral's template requires).
fn assistant(calls: &[(&str, Value)]) -> Message {
    let mut m = Message::new("assistant", "");
    let tc: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("abc12345{i}"), "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    m.extra.insert("tool_calls".into(), Value::Array(tc));
    m
}

/// The assistant's reply as `e`'s template renders it: the conversation
/// with the reply, less the prompt that asks for it.
fn rendered_reply(e: &Entry, calls: &[(&str, Value)]) -> Option<String> {
    let src = source(e);
    let t = ChatTemplate::new(Some(src.clone()), &e.bos, &e.eos);
    let options = TemplateOptions::new();
    let tools = tools();
    let user = Message::new("user", "What's the weather in Paris and Tokyo?");
    let render = |messages: &[Message], gen: bool| {
        let input = ChatInput {
            messages,
            tools: Some(&tools),
            options: &options,
            add_generation_prompt: gen,
        };
        t.render_jinja(&src, &input).ok()
    };
    let prompt = render(std::slice::from_ref(&user), true)?;
    let whole = render(&[user.clone(), assistant(calls)], false)?;
    Some(match whole.strip_prefix(prompt.as_str()) {
        Some(reply) => reply.to_string(),
        None => whole[whole.find(&user.content)? + user.content.len()..].to_string(),
    })
}

/// Replies written by hand from a template's own markers, for the
/// templates that refuse to render this conversation (Kimi-K2-Thinking
/// wants list methods the sandbox refuses, as jinja2's does).
fn by_hand(format: CallFormat) -> String {
    match format {
        CallFormat::Kimi => concat!(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0",
            "<|tool_call_argument_begin|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|tool_call_end|>",
            "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>",
            "{\"city\": \"Tokyo\"}<|tool_call_end|><|tool_calls_section_end|>"
        )
        .into(),
        other => panic!("no hand-written reply for {}", other.name()),
    }
}

/// Each family's recorded reply (ending where the model's end-of-turn token
/// would stop it) and its format.
pub(super) fn recorded() -> Vec<(String, CallFormat, String)> {
    entries()
        .into_iter()
        .map(|e| {
            let format = expected_format(&e.family);
            let reply = match rendered_reply(&e, &the_calls()) {
                Some(r) => r,
                None => {
                    let frame = format.frame().expect("a framed format");
                    assert!(source(&e).contains(frame.open), "{}", e.file);
                    by_hand(format)
                }
            };
            let reply = match reply.rfind(&e.eos) {
                Some(end) => reply[..end].to_string(),
                None => reply,
            };
            (e.file, format, reply)
        })
        .collect()
}

/// The recorded replies as a file, `tests/data/templates/recorded_calls.json`,
/// for the parsers' comparison outside the tests (benches/chat_parser: the
/// Rust parsers and llama.cpp's own on the same replies): each family's
/// template, format, reply and the calls it holds. It is what [`recorded`]
/// renders now; `BMOE_BLESS=1` writes it again.
#[test]
fn the_recorded_replies_file_is_what_the_templates_render() {
    let path = data().join("recorded_calls.json");
    let replies: Vec<Value> = recorded()
        .into_iter()
        .map(|(file, format, reply)| {
            let n = if format == CallFormat::Harmony { 1 } else { 2 };
            let calls: Vec<Value> = want(n)
                .into_iter()
                .map(|(name, args)| json!({"name": name, "arguments": args}))
                .collect();
            json!({"file": file, "format": format.name(), "reply": reply, "calls": calls})
        })
        .collect();
    let now = serde_json::to_string_pretty(&json!({"replies": replies})).expect("JSON") + "\n";
    if std::env::var_os("BMOE_BLESS").is_some() {
        std::fs::write(&path, &now).expect("write the recorded replies");
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == now,
        "{} is not what the templates render now: `BMOE_BLESS=1 cargo test --lib recorded_replies_file` writes it again",
        path.display()
    );
}

/// The calls as names and argument values.
pub(super) fn calls_of(p: &Parsed) -> Vec<(String, Value)> {
    p.calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str(&c.arguments).expect("arguments are JSON");
            (c.name.clone(), args)
        })
        .collect()
}

fn want(n: usize) -> Vec<(String, Value)> {
    the_calls()
        .into_iter()
        .take(n)
        .map(|(n, a)| (n.to_string(), a))
        .collect()
}

#[test]
fn each_familys_rendered_calls_parse_back() {
    let tools = tools();
    for (file, format, reply) in recorded() {
        let p = parse_with_tools(format, &reply, Some(&tools));
        // gpt-oss's template renders only an assistant message's first call.
        let n = if format == CallFormat::Harmony { 1 } else { 2 };
        assert_eq!(calls_of(&p), want(n), "{file}: {reply:?}");
        if let Some(frame) = format.frame() {
            assert!(!p.content.contains(frame.open), "{file}: {:?}", p.content);
        }
    }
}

#[test]
fn each_familys_cut_call_stays_text() {
    for (file, format, reply) in recorded() {
        let frame = format.frame().map_or("<|channel|>", |f| f.open);
        let at = reply.find(frame).expect("the call's marker") + frame.len() + 3;
        let mut cut = at.min(reply.len() - 1);
        while !reply.is_char_boundary(cut) {
            cut += 1;
        }
        let p = parse(format, &reply[..cut]);
        assert!(p.calls.is_empty(), "{file}: {:?}", &reply[..cut]);
        assert!(p.content.ends_with(&reply[at - 3..cut]), "{file}: {p:?}");
    }
}

#[test]
fn each_familys_bad_arguments_stay_text() {
    // What closes "Paris" in each format: without it, the first call's
    // arguments are no longer JSON, or its value runs into the next one.
    let closers = [
        "\"",
        "'",
        "</parameter>",
        "</arg_value>",
        "</｜DSML｜parameter>",
    ];
    for (file, format, reply) in recorded() {
        let after = reply.find("Paris").expect("the first call") + "Paris".len();
        let (at, closer) = closers
            .iter()
            .filter_map(|c| reply[after..].find(c).map(|i| (after + i, *c)))
            .min()
            .expect("a closer");
        let bad = format!("{}{}", &reply[..at], &reply[at + closer.len()..]);
        let p = parse(format, &bad);
        assert!(p.content.contains("Paris"), "{file}: {bad:?} gave {p:?}");
        assert!(
            calls_of(&p).iter().all(|(_, a)| a["city"] != "Paris"),
            "{file}: {p:?}"
        );
    }
}

/// `text` streamed in pieces of the given sizes: the content handed out
/// along the way plus the rest, the calls whose pieces went out along the
/// way (assembled), those that went out at the end, and the split.
fn streamed_in(
    format: CallFormat,
    text: &str,
    sizes: &[usize],
) -> (String, Vec<ToolCall>, Vec<ToolCall>, Parsed) {
    let (out, early, late, parsed) = streamed_live(format, text, sizes, None);
    (out, assemble(&early), assemble(&late), parsed)
}

/// As [`streamed_in`], live when given the request's tools, with the calls'
/// pieces as they went out: those along the way, then those at the end.
pub(super) fn streamed_live(
    format: CallFormat,
    text: &str,
    sizes: &[usize],
    live: Option<Value>,
) -> (String, Vec<CallPart>, Vec<CallPart>, Parsed) {
    let on = live.is_some();
    let mut s = CallStream::with_tools(format, live).live(on);
    let (mut out, mut early) = (String::new(), Vec::new());
    let mut at = 0;
    let mut i = 0;
    while at < text.len() {
        let mut end = (at + sizes[i % sizes.len()]).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push_str(&s.push(&text[at..end]));
        early.extend(s.take_parts());
        at = end;
        i += 1;
    }
    let (rest, late, parsed) = s.finish();
    out.push_str(&rest);
    (out, early, late, parsed)
}

/// Calls put together from their pieces (each call's first piece names it).
pub(super) fn assemble(parts: &[CallPart]) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for p in parts {
        match &p.name {
            Some(name) => {
                assert_eq!(p.index, calls.len(), "a call's first piece names it");
                calls.push(ToolCall {
                    id: p.id.clone(),
                    name: name.clone(),
                    arguments: p.arguments.clone(),
                });
            }
            None => {
                let c = &mut calls[p.index];
                assert_eq!(c.id, p.id);
                c.arguments.push_str(&p.arguments);
            }
        }
    }
    calls
}

pub(super) fn names_args(calls: &[ToolCall]) -> Vec<(String, Value)> {
    calls_of(&Parsed {
        calls: calls.to_vec(),
        ..Parsed::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Streamed, each family's calls are the whole parse's, with the same
    /// ids, and those of a closed block go out before the reply ends; the
    /// content is the whole parse's.
    #[test]
    fn each_familys_reply_streamed_in_random_pieces_splits_as_whole(
        sizes in proptest::collection::vec(1usize..24, 1..16),
        prose in "[a-z ]{0,12}",
    ) {
        for (file, format, reply) in recorded() {
            let text = format!("{prose}{reply}");
            let whole = parse(format, &text);
            let (content, early, late, p) = streamed_in(format, &text, &sizes);
            prop_assert_eq!(&content, &whole.content, "{}", file);
            prop_assert_eq!(calls_of(&p), calls_of(&whole), "{}", file);
            let sent: Vec<ToolCall> = early.iter().chain(&late).cloned().collect();
            prop_assert_eq!(&sent, &p.calls, "{}", file);
            prop_assert_eq!(names_args(&sent), calls_of(&whole), "{}", file);
            if format.frame().is_some_and(|f| f.close.is_some()) {
                prop_assert!(late.is_empty(), "{}: calls held to the end", file);
            }
        }
    }

    /// Two framed calls: the first goes out as soon as its block closes,
    /// before the second is written; a malformed block between them is text.
    #[test]
    fn a_call_goes_out_when_its_block_closes(
        sizes in proptest::collection::vec(1usize..12, 1..8),
    ) {
        let call = |city: &str| format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
        );
        let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {city}\n</tool_call>";
        let first = format!("Checking.\n{}", call("Paris"));
        let text = format!("{first}\n{bad}\n{}", call("Tokyo"));
        let (_, early, _, _) = streamed_in(CallFormat::Hermes, &first, &sizes);
        prop_assert_eq!(early.len(), 1);
        let whole = parse(CallFormat::Hermes, &text);
        let (content, early, late, _) = streamed_in(CallFormat::Hermes, &text, &sizes);
        prop_assert_eq!(&content, &whole.content);
        prop_assert!(content.contains("{city}"), "the malformed call is text: {:?}", content);
        prop_assert!(late.is_empty());
        prop_assert_eq!(names_args(&early), calls_of(&whole));
        prop_assert_eq!(early.len(), 2);
    }
}

#[test]
fn deepseek_r1_calls_name_the_function_after_the_separator() {
    let r1 = concat!(
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n",
        "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    );
    let p = parse(CallFormat::DeepSeek, r1);
    assert_eq!(p.content, "Checking.");
    assert_eq!(
        calls_of(&p),
        vec![("get_weather".into(), json!({"city": "Paris"}))]
    );
}

#[test]
fn python_style_values_read_as_json() {
    let text = "<|tool_call_start|>[f(a=\"x\\\"y\", n=-2, r=1.5, t=True, z=None, l=['a', 2], d={\"k\": [1]}), g()]<|tool_call_end|>";
    let p = parse(CallFormat::Pythonic, text);
    assert_eq!(p.content, "");
    assert_eq!(
        calls_of(&p),
        vec![
            (
                "f".into(),
                json!({"a": "x\"y", "n": -2, "r": 1.5, "t": true, "z": null, "l": ["a", 2], "d": {"k": [1]}})
            ),
            ("g".into(), json!({})),
        ]
    );
    // Positional arguments or an unclosed call are no calls.
    for bad in ["[f('x')]", "[f(a=1]", "[f(a=1) g()]"] {
        let text = format!("<|tool_call_start|>{bad}<|tool_call_end|>");
        assert_eq!(parse(CallFormat::Pythonic, &text).content, text);
    }
}

#[test]
fn mistral_calls_follow_the_text_and_bad_json_stays_text() {
    let text = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}";
    let p = parse(CallFormat::Mistral, text);
    assert_eq!(p.content, "Sure.");
    assert_eq!(
        calls_of(&p),
        vec![("get_weather".into(), json!({"city": "Paris"}))]
    );
    for bad in [
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
        "[TOOL_CALLS]get_weather[ARGS]{} and more",
        "[TOOL_CALLS]",
        "[TOOL_CALLS] [1, 2]",
    ] {
        let p = parse(CallFormat::Mistral, bad);
        assert!(p.calls.is_empty(), "{bad}");
        assert_eq!(p.content, bad);
    }
}

#[test]
fn control_token_formats_are_written_as_text_when_tools_are_offered() {
    for f in [
        CallFormat::DeepSeek,
        CallFormat::Kimi,
        CallFormat::Mistral,
        CallFormat::Pythonic,
    ] {
        assert!(
            f.special_text(true) && !f.special_text(false),
            "{}",
            f.name()
        );
    }
    assert!(CallFormat::Harmony.special_text(false));
    for f in [CallFormat::Hermes, CallFormat::Glm, CallFormat::MiniMax] {
        assert!(!f.special_text(true), "{}", f.name());
    }
}
