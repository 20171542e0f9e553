use super::*;
use serde_json::json;

/// The refusal of `schema`: its keyword, pointer and kind.
fn refused(schema: Value) -> (String, String, RefusalKind) {
    let e = schema_check(&schema).expect_err(&schema.to_string());
    assert!(e.to_string().contains(&e.keyword), "{e}");
    (e.keyword, e.pointer, e.kind)
}

fn kw(schema: Value) -> String {
    refused(schema).0
}

#[test]
fn crossed_bounds_are_refused_as_empty_naming_the_keyword() {
    use RefusalKind::Empty;
    let s = json!({"type": "string", "minLength": 10, "maxLength": 2});
    assert_eq!(refused(s), ("minLength".into(), "".into(), Empty));
    let a = json!({"type": "object", "properties": {"l": {"type": "array", "minItems": 3, "maxItems": 1}}});
    assert_eq!(
        refused(a),
        ("minItems".into(), "/properties/l".into(), Empty)
    );
    assert_eq!(
        refused(json!({"type": "integer", "minimum": 10, "maximum": 2})).2,
        Empty
    );
    assert_eq!(
        kw(json!({"type": "integer", "exclusiveMinimum": 5, "maximum": 5})),
        "maximum"
    );
    assert_eq!(
        kw(json!({"type": "integer", "minimum": 2.5, "maximum": 2.9})),
        "maximum"
    );
    schema_check(&json!({"type": "integer", "minimum": 2, "maximum": 2})).unwrap();
    schema_check(&json!({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 3}))
        .unwrap();
}

#[test]
fn repetition_beyond_llama_cpps_bound_is_refused_as_too_large() {
    for s in [
        json!({"type": "string", "minLength": 1000000}),
        json!({"type": "string", "maxLength": 2001}),
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 1000000}),
        json!({"type": "string", "pattern": "^a{5000}$"}),
        json!({"type": "array", "items": {"type": "string"}, "maxItems": 1000}),
        json!({"type": "string", "pattern": "^(a{100}){100}$"}),
    ] {
        assert_eq!(refused(s).2, RefusalKind::TooLarge);
    }
    schema_check(&json!({"type": "string", "maxLength": 2000})).unwrap();
    schema_check(&json!({"type": "string", "pattern": "^(a{10}){10}$"})).unwrap();
}

#[test]
fn keywords_the_grammar_drops_are_refused() {
    assert_eq!(kw(json!({"not": {}})), "not");
    assert_eq!(
        kw(json!({"type": "array", "uniqueItems": true})),
        "uniqueItems"
    );
    assert_eq!(kw(json!({"type": "number", "minimum": 0})), "minimum");
    assert_eq!(kw(json!({"minimum": 3})), "minimum");
    assert_eq!(
        kw(json!({"type": "integer", "multipleOf": 2})),
        "multipleOf"
    );
    assert_eq!(
        kw(json!({"type": "string", "pattern": "^a+$", "maxLength": 3})),
        "maxLength"
    );
    assert_eq!(
        kw(json!({"anyOf": [{"type": "string"}], "type": "integer"})),
        "type"
    );
    assert_eq!(
        kw(json!({"$ref": "#/$defs/a", "minimum": 1, "$defs": {"a": {}}})),
        "minimum"
    );
    let req = json!({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]});
    assert_eq!(kw(req), "required");
    let min_ex = json!({"type": "integer", "minimum": 0, "exclusiveMinimum": 3});
    assert_eq!(kw(min_ex), "exclusiveMinimum");
    let tuple = json!({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2});
    assert_eq!(kw(tuple), "minItems");
}

/// A keyword that applies to another type than the one written, and
/// annotations, constrain nothing.
#[test]
fn vacuous_keywords_and_annotations_pass() {
    for s in [
        json!({"type": "string", "minimum": 3, "title": "t", "description": "d", "default": "x"}),
        json!({"type": "integer", "format": "int32", "maxLength": 4}),
        json!({"type": "string", "format": "email"}),
        json!({"type": "array", "uniqueItems": false, "items": {"type": "boolean"}}),
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"a": {"type": ["string", "null"], "enum": ["x", null]}},
            "required": ["a"], "additionalProperties": false}),
        json!({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}),
    ] {
        schema_check(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

#[test]
fn allof_passes_only_objects_it_can_merge_or_enums_it_can_intersect() {
    let e = refused(json!({"allOf": [{"type": "string"}, {"type": "integer"}]}));
    assert_eq!((e.0.as_str(), e.2), ("allOf", RefusalKind::Unsupported));
    let disjoint = json!({"allOf": [{"enum": ["a", "b"]}, {"enum": ["c"]}]});
    assert_eq!(refused(disjoint).2, RefusalKind::Empty);
    schema_check(&json!({"allOf": [{"enum": ["a", "b"]}, {"enum": ["b"]}]})).unwrap();
    let merged = json!({"$defs": {"b": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"$ref": "#/$defs/b"}]});
    schema_check(&merged).unwrap();
    let clash = json!({"allOf": [{"properties": {"a": {"type": "string"}}},
        {"properties": {"a": {"type": "integer"}}}]});
    assert_eq!(kw(clash), "allOf");
}

#[test]
fn const_and_enum_values_must_satisfy_the_rest_of_their_schema() {
    let e = refused(json!({"type": "integer", "const": "abc"}));
    assert_eq!((e.0.as_str(), e.2), ("const", RefusalKind::Empty));
    assert_eq!(kw(json!({"type": "string", "enum": ["ok", 3]})), "enum");
    assert_eq!(
        kw(json!({"type": "string", "maxLength": 2, "enum": ["abc"]})),
        "enum"
    );
    schema_check(&json!({"type": "string", "enum": ["a", "b"]})).unwrap();
}

#[test]
fn a_large_enum_is_refused_as_too_large() {
    let many: Vec<String> = (0..100_000).map(|i| format!("value-{i}")).collect();
    let t = std::time::Instant::now();
    let e = refused(json!({"type": "string", "enum": many}));
    assert_eq!((e.0.as_str(), e.2), ("enum", RefusalKind::TooLarge));
    assert!(t.elapsed().as_millis() < 500, "{:?}", t.elapsed());
    let t = std::time::Instant::now();
    let both = json!({"allOf": [{"enum": many}, {"enum": many}]});
    assert_eq!(refused(both).2, RefusalKind::TooLarge);
    assert!(t.elapsed().as_millis() < 500, "{:?}", t.elapsed());
    let fits: Vec<String> = (0..MAX_ENUM_VALUES).map(|i| format!("v{i}")).collect();
    schema_check(&json!({"enum": fits})).unwrap();
}

#[test]
fn one_of_must_be_disjoint() {
    let overlap = json!({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]});
    assert_eq!(kw(overlap), "oneOf");
    schema_check(&json!({"oneOf": [{"type": "string"}, {"type": "integer"}]})).unwrap();
    let tagged = json!({"oneOf": [
        {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]});
    schema_check(&tagged).unwrap();
}

#[test]
fn patterns_outside_the_translatable_subset_are_refused() {
    for p in [
        "((", "^((a)$", "^(a)\\1$", "^(?=a)a$", "^(?!a).$", "[a-z]+", "^\\d{3}$", "^.*$", "^[^a]$",
        "^[ -~]+$", "^a\"b$", "^(a|)$", "^a**$", "^a{3,1}$", "^é+$",
    ] {
        let e = refused(json!({"type": "string", "pattern": p}));
        assert_eq!(e.0, "pattern", "{p}");
    }
    for p in [
        "^[a-z]{2,8}$",
        "^(?:ab|cd)+-[0-9]{3}$",
        "^\\(\\d?\\)$".replace("\\d", "[0-9]").as_str(),
        "^é[#-\\[]$",
        "^(é)+$",
    ] {
        schema_check(&json!({"type": "string", "pattern": p}))
            .unwrap_or_else(|e| panic!("{p}: {e}"));
    }
}

#[test]
fn the_check_is_linear_and_bounded_in_size() {
    let mut deep = json!({"type": "integer"});
    for _ in 0..100 {
        deep = json!({"type": "array", "items": deep});
    }
    assert_eq!(refused(deep).2, RefusalKind::TooLarge);
}

/// What passes converts, and llama.cpp parses the grammar (the bounds are
/// within its own: no parse error, no runaway build).
#[test]
fn what_passes_converts_and_parses() {
    use crate::llama::grammar::Grammar;
    for s in [
        json!({"type": "string", "maxLength": MAX_REPEAT}),
        json!({"type": "string", "minLength": MAX_REPEAT}),
        json!({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": MAX_ITEMS}),
        json!({"type": "array", "items": {"type": "string", "maxLength": MAX_REPEAT}, "maxItems": MAX_ITEMS}),
        json!({"type": "string", "pattern": "^(?:ab|c[d-f])+-[0-9]{3}$"}),
        json!({"type": "string", "pattern": "^(a{10}){100}$"}),
        json!({"type": "integer", "exclusiveMinimum": -5, "maximum": 5}),
        json!({"type": "string", "pattern": "^(é)+[à-ü]{1,3}$"}),
        json!({"type": ["string", "null"], "enum": ["x", null]}),
    ] {
        let t = std::time::Instant::now();
        let g = Grammar::json(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
        g.check().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(t.elapsed().as_secs() < 2, "{s}: {:?}", t.elapsed());
    }
}

/// The numbers in docs/serving.md ("Schemas"): the converter's output and
/// llama.cpp's parse as `maxLength` grows, and the check's own time
/// (`cargo test --lib -- --ignored measure_growth --nocapture`).
#[test]
#[ignore]
fn measure_growth() {
    use crate::llama::grammar::Grammar;
    for n in [16u64, 100, 500, 1000, 2000] {
        let s = json!({"type": "string", "maxLength": n});
        let t = std::time::Instant::now();
        let g = Grammar::json(&s).unwrap();
        let conv = t.elapsed();
        g.check().unwrap();
        eprintln!(
            "maxLength {n}: gbnf {} bytes, convert {:?}, parse {:?}",
            g.gbnf.len(),
            conv,
            t.elapsed() - conv
        );
    }
    for n in [1usize, 2] {
        let s = json!({"type": "array", "items": {"type": "string", "maxLength": 2000}, "maxItems": n * 250});
        let t = std::time::Instant::now();
        let g = Grammar::json(&s).unwrap();
        g.check().unwrap();
        eprintln!("array of {} strings of 2000: {:?}", n * 250, t.elapsed());
    }
    let many: Vec<String> = (0..100_000).map(|i| format!("v{i:06}")).collect();
    let t = std::time::Instant::now();
    let e = schema_check(&json!({"type": "string", "enum": many}));
    eprintln!(
        "enum 100k check: {:?} {:?}",
        t.elapsed(),
        e.map_err(|e| e.keyword)
    );
    let t = std::time::Instant::now();
    let e = schema_check(&json!({"type": "string", "minLength": 10, "maxLength": 2}));
    eprintln!(
        "bomb check: {:?} {:?}",
        t.elapsed(),
        e.map_err(|e| e.keyword)
    );
}
