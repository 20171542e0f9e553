//! Calls streamed live (the reply under a call grammar) on every family's
//! recorded reply: pieces that join into the whole parse's calls, the name
//! first and a string argument as it is written, a call cut by the end.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::tests_families::{assemble, calls_of, names_args, recorded, streamed_live, tools};
use super::*;

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
