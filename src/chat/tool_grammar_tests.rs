use serde_json::{json, Value};

use super::*;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "ping"}}
    ])
}

const FORMATS: [CallFormat; 12] = [
    CallFormat::None,
    CallFormat::Hermes,
    CallFormat::XmlFunction,
    CallFormat::Harmony,
    CallFormat::Glm,
    CallFormat::MiniMax,
    CallFormat::Dsml,
    CallFormat::DeepSeek,
    CallFormat::Kimi,
    CallFormat::JsonList,
    CallFormat::Mistral,
    CallFormat::Pythonic,
];

/// Every format's forced grammar parses in llama.cpp, opens with the
/// format's own call marker and names each tool; required is not lazy.
#[test]
fn every_format_forces_a_call_in_its_own_markers() {
    for format in FORMATS {
        let g = call_grammar(format, &tools(), &ToolChoice::Required).unwrap();
        g.check()
            .unwrap_or_else(|e| panic!("{format:?}: {e}\n{}", g.gbnf));
        assert!(g.triggers.is_empty(), "{format:?}");
        let root = g.gbnf.lines().next().unwrap();
        let open = match format.frame().or(CallFormat::Hermes
            .frame()
            .filter(|_| format == CallFormat::None))
        {
            Some(f) => f.open.to_string(),
            None => HARMONY_OPEN.to_string(),
        };
        assert!(
            root.starts_with(&format!("root ::= \"{}", lit(&open).trim_matches('"')))
                || root.contains(&lit(&open).trim_matches('"').to_string()),
            "{format:?}: {root}"
        );
        assert!(
            root.contains("get_weather") && root.contains("ping"),
            "{format:?}: {root}"
        );
    }
}

/// The values of the per-parameter formats: a string enum as bare text
/// alternatives, an integer as the converter's JSON rule.
#[test]
fn xml_parameters_are_text_or_json_by_their_type() {
    let g = call_grammar(CallFormat::XmlFunction, &tools(), &ToolChoice::Required).unwrap();
    let root = g.gbnf.lines().next().unwrap();
    assert!(
        root.contains("\"<parameter=city>\\n\" ( \"Paris\" | \"Oslo\" ) \"\\n</parameter>\\n\""),
        "{root}"
    );
    assert!(
        root.contains("\"<parameter=days>\\n\" t0-p1-root"),
        "{root}"
    );
    assert!(g.gbnf.contains("\nt0-p1-root ::= "), "{}", g.gbnf);
    let dsml = call_grammar(CallFormat::Dsml, &tools(), &ToolChoice::Required).unwrap();
    assert!(
        dsml.gbnf.contains("name=\\\"city\\\" string=\\\"true\\\""),
        "{}",
        dsml.gbnf
    );
    assert!(
        dsml.gbnf.contains("name=\\\"days\\\" string=\\\"false\\\""),
        "{}",
        dsml.gbnf
    );
    let py = call_grammar(CallFormat::Pythonic, &tools(), &ToolChoice::Required).unwrap();
    assert!(
        py.gbnf
            .contains("\"city=\" t0-p0-root \", \" \"days=\" t0-p1-root"),
        "{}",
        py.gbnf
    );
}

/// A named function forces that tool alone; a name not among the tools and a
/// schema the converter refuses are errors naming them.
#[test]
fn a_named_choice_keeps_one_tool_and_bad_input_is_named() {
    let named = ToolChoice::Named("ping".into());
    let g = call_grammar(CallFormat::Kimi, &tools(), &named).unwrap();
    let root = g.gbnf.lines().next().unwrap();
    assert!(
        root.contains("functions.ping:0") && !root.contains("get_weather"),
        "{root}"
    );
    let e = call_grammar(
        CallFormat::Kimi,
        &tools(),
        &ToolChoice::Named("nope".into()),
    );
    assert_eq!(e.unwrap_err(), ToolGrammarError::Unknown("nope".into()));
    let bad = json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"$ref": "#/$defs/missing"}}}}}]);
    let e = call_grammar(CallFormat::Hermes, &bad, &ToolChoice::Required).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("tools[0] (f) parameters: "), "{text}");
    assert!(text.contains("/properties/s"), "{text}");
}

/// Under auto the grammar is lazy, woken by the format's opening marker
/// written as a regular expression.
#[test]
fn auto_is_lazy_and_triggered_where_the_call_opens() {
    let cases = [
        (CallFormat::Hermes, "<tool_call>\n"),
        (CallFormat::Kimi, "<\\|tool_calls_section_begin\\|>"),
        (CallFormat::Mistral, "\\[TOOL_CALLS\\]\\["),
        (CallFormat::Harmony, "<\\|channel\\|>commentary to="),
        (CallFormat::DeepSeek, "<｜tool▁calls▁begin｜>"),
        (CallFormat::Pythonic, "<\\|tool_call_start\\|>\\["),
    ];
    for (format, want) in cases {
        assert_eq!(trigger(format), want, "{format:?}");
        let g = call_grammar(format, &tools(), &ToolChoice::Auto).unwrap();
        assert_eq!(g.triggers, vec![want.to_string()]);
        g.check().unwrap();
    }
}

#[test]
fn rename_prefixes_rule_names_but_not_literals_classes_or_counts() {
    let g = "root ::= \"{\" space [a-z\\]] x{0,20} \"a\\\"b\" char*\nspace ::= \" \"?\n";
    assert_eq!(
        rename(g, "t0"),
        "t0-root ::= \"{\" t0-space [a-z\\]] t0-x{0,20} \"a\\\"b\" t0-char*\nt0-space ::= \" \"?\n"
    );
}

#[test]
fn text_values_keep_to_their_enum_or_length() {
    assert_eq!(
        text_rule(&json!({"type": "string", "enum": ["a", "b\""]})),
        "( \"a\" | \"b\\\"\" )"
    );
    assert_eq!(
        text_rule(&json!({"type": "string", "maxLength": 8})),
        "[^<]{0,8}"
    );
    assert_eq!(
        text_rule(&json!({"type": "string", "minLength": 2})),
        "[^<]{2,}"
    );
}

#[test]
fn a_forced_grammar_after_an_open_reasoning_block_closes_it_first() {
    let forced = call_grammar(CallFormat::XmlFunction, &tools(), &ToolChoice::Required).unwrap();
    let g = after_open_reasoning(forced.clone());
    assert!(g.gbnf.starts_with("root ::= \"</think>\""), "{}", g.gbnf);
    assert!(g.gbnf.contains("answer-root ::="), "{}", g.gbnf);
    g.check().unwrap();
    let lazy = call_grammar(CallFormat::XmlFunction, &tools(), &ToolChoice::Auto).unwrap();
    assert_eq!(after_open_reasoning(lazy.clone()), lazy);
}

/// Each tool's parameters are checked whole before any grammar is built: a
/// schema no document satisfies is refused everywhere (under `auto` too),
/// one whose keyword a format cannot honour only where a call is forced.
#[test]
fn tool_schemas_are_checked_before_a_grammar_is_built() {
    let tool = |params: Value| json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    let bomb = tool(json!({"type": "object", "required": ["a"],
        "properties": {"a": {"type": "string", "minLength": 10, "maxLength": 2}}}));
    for format in [CallFormat::Hermes, CallFormat::XmlFunction, CallFormat::Glm] {
        let e = call_grammar(format, &bomb, &ToolChoice::Auto).unwrap_err();
        assert!(e.refused_everywhere(), "{format:?}: {e}");
        assert!(
            e.to_string().contains("\"minLength\" at #/properties/a"),
            "{e}"
        );
    }
    let patterned = tool(json!({"type": "object", "required": ["a"],
        "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}}));
    call_grammar(CallFormat::Hermes, &patterned, &ToolChoice::Required).unwrap();
    let e = call_grammar(CallFormat::XmlFunction, &patterned, &ToolChoice::Required).unwrap_err();
    assert!(!e.refused_everywhere(), "{e}");
    assert!(e.to_string().contains("\"pattern\""), "{e}");
}
