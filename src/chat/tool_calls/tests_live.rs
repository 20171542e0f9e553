//! Calls streamed live (the reply under a call grammar) on every family's
//! recorded reply: pieces that join into the whole parse's calls, the name
//! first and a string argument as it is written, a call cut by the end.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::tests_families::{calls_of, names_args, recorded, tools};
use super::*;

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// Live (the reply under a call grammar), each family's calls go out as
    /// pieces that join into the whole parse's calls, with the same ids;
    /// the content is the whole parse's.
    #[test]
    fn each_familys_live_pieces_join_into_the_whole_calls(
        sizes in proptest::collection::vec(1usize..9, 1..8),
        prose in "[a-z ]{0,12}",
    ) {
        let tools = tools();
        for (file, format, reply) in recorded() {
            let text = format!("{prose}{reply}");
            let whole = parse_with_tools(format, &text, Some(&tools));
            let (content, early, late, p) = streamed_live(format, &text, &sizes, Some(tools.clone()));
            prop_assert_eq!(&content, &whole.content, "{}", file);
            let parts: Vec<CallPart> = early.into_iter().chain(late).collect();
            let sent = assemble(&parts);
            prop_assert_eq!(&sent, &p.calls, "{}", file);
            prop_assert_eq!(names_args(&sent), calls_of(&whole), "{}", file);
        }
    }
}

/// Live, the first call's name goes out before its arguments are written,
/// and its string argument as it is written: once the reply's text reaches
/// "Pari", the call is named and (but for the Python-style calls, whose
/// arguments go out with their block) its arguments so far end in "Pari".
#[test]
fn each_familys_live_call_is_named_first_and_its_string_grows() {
    for (file, format, reply) in recorded() {
        let at = reply.find("Pari").expect("the first call") + "Pari".len();
        let (_, parts, _, _) = streamed_live(format, &reply[..at], &[1], Some(tools()));
        let calls = assemble(&parts);
        assert_eq!(
            calls.first().map(|c| c.name.as_str()),
            Some("get_weather"),
            "{file}: {parts:?}"
        );
        if format != CallFormat::Pythonic {
            assert!(calls[0].arguments.ends_with("\"Pari"), "{file}: {parts:?}");
            assert!(
                parts.len() > 2,
                "{file}: the arguments in pieces: {parts:?}"
            );
        }
    }
}

/// Live, a call cut by the reply's end goes out closed with the arguments
/// it had, and the whole split says so.
#[test]
fn a_live_call_cut_by_the_end_is_closed_with_what_it_had() {
    for (file, format, reply) in recorded() {
        let at = reply.find("Pari").expect("the first call") + "Pari".len();
        let (content, early, late, p) = streamed_live(format, &reply[..at], &[3], Some(tools()));
        let parts: Vec<CallPart> = early.into_iter().chain(late).collect();
        let sent = assemble(&parts);
        assert_eq!(sent, p.calls, "{file}");
        assert_eq!(sent.len(), 1, "{file}: {sent:?}");
        assert!(p.cut, "{file}");
        let args: Value = serde_json::from_str(&sent[0].arguments).expect("closed JSON");
        if format != CallFormat::Pythonic {
            assert_eq!(args, json!({"city": "Pari"}), "{file}");
        }
        assert_eq!(content, p.content, "{file}");
        assert!(!content.contains("Pari"), "{file}: {content:?}");
    }
}
