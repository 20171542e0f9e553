//! A JSON schema checked before llama.cpp's json-schema-to-grammar sees it:
//! every keyword the converter would ignore, mishandle or blow up on is
//! refused here, in pure Rust and in time linear in the schema, naming the
//! keyword and its JSON pointer. What passes converts to a grammar whose
//! every document validates against the schema (a subset of its documents:
//! the grammar writes no optional whitespace inside strings, at most 16
//! digits, ...), within llama.cpp's own bounds on repetition.
//!
//! The converter (common/json-schema-to-grammar.cpp) picks one reading of
//! each sub-schema, in this order: `$ref`; `oneOf`/`anyOf`; `type` as a
//! list; `const`; `enum`; then by `type` (or, without one, `properties`,
//! `allOf`, `items`, string keywords) an object, an array, a string, an
//! integer, a number, a boolean, null or any value. Every other keyword of
//! that sub-schema is dropped; here such a keyword is refused when it
//! constrains the values that reading writes (a string keyword beside an
//! integer type constrains nothing and passes).

mod combine;
mod kinds;
mod pattern;
mod refusal;

pub use refusal::{
    RefusalKind, SchemaRefusal, MAX_DEPTH, MAX_ENUM_BYTES, MAX_ENUM_VALUES, MAX_ITEMS, MAX_NODES,
    MAX_PATTERN_BYTES, MAX_REPEAT,
};

use serde_json::{Map, Value};

use kinds::{applies, Applies, Emits};
use refusal::refuse;

/// Whether `schema` converts to a grammar that admits only its documents,
/// within the bounds above.
pub fn schema_check(schema: &Value) -> Result<(), SchemaRefusal> {
    let mut walk = Walk {
        root: schema,
        nodes: 0,
    };
    walk.node(schema, "", 0)
}

/// Keywords no reading of the converter honours.
const NEVER: &[&str] = &[
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
    "patternProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "multipleOf",
    "$dynamicRef",
    "$recursiveRef",
];

struct Walk<'a> {
    root: &'a Value,
    nodes: usize,
}

impl Walk<'_> {
    /// Check the sub-schema `s` at pointer `at`.
    fn node(&mut self, s: &Value, at: &str, depth: usize) -> Result<(), SchemaRefusal> {
        self.nodes += 1;
        if self.nodes > MAX_NODES || depth > MAX_DEPTH {
            let why = format!(
                "the schema holds more than {MAX_NODES} sub-schemas or nests deeper than {MAX_DEPTH}"
            );
            return Err(refuse(at, "schema", RefusalKind::TooLarge, why));
        }
        // Not an object: the converter refuses it by itself.
        let Some(o) = s.as_object() else {
            return Ok(());
        };
        for kw in NEVER {
            if o.get(*kw).is_some_and(|v| !vacuous(kw, v)) {
                let why = "the grammar cannot honour this keyword; drop it".to_string();
                return Err(refuse(at, kw, RefusalKind::Unsupported, why));
            }
        }
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = o.get(key) {
                for (name, d) in defs {
                    self.node(d, &format!("{at}/{key}/{}", escape(name)), depth + 1)?;
                }
            }
        }
        self.reading(o, at, depth)
    }

    /// The converter's one reading of `o`, checked.
    fn reading(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        if o.contains_key("$ref") {
            return only(
                o,
                at,
                &["$ref"],
                Emits::Any,
                "beside $ref the grammar follows only the reference",
            );
        }
        if let Some((key, alts)) = alternatives(o) {
            if o.contains_key("oneOf") && o.contains_key("anyOf") {
                let why = "beside oneOf the grammar drops anyOf".to_string();
                return Err(refuse(at, "anyOf", RefusalKind::Unsupported, why));
            }
            only(
                o,
                at,
                &[key],
                Emits::Any,
                "beside oneOf/anyOf the grammar follows only the alternatives",
            )?;
            if key == "oneOf" && !kinds::disjoint(self.root, alts) {
                let why = "the alternatives may overlap, and the grammar would admit a document that matches two (oneOf wants exactly one): use anyOf, or alternatives of different types or with a distinct const property".to_string();
                return Err(refuse(at, key, RefusalKind::Unsupported, why));
            }
            for (i, a) in alts.iter().enumerate() {
                self.node(a, &format!("{at}/{key}/{i}"), depth + 1)?;
            }
            return Ok(());
        }
        if o.contains_key("const") || o.contains_key("enum") {
            return self.values(o, at);
        }
        if let Some(Value::Array(types)) = o.get("type") {
            for (i, t) in types.iter().enumerate() {
                let mut one = o.clone();
                one.insert("type".into(), t.clone());
                self.typed(&one, &format!("{at}/type/{i}"), depth)?;
            }
            return Ok(());
        }
        self.typed(o, at, depth)
    }

    /// A sub-schema read by its `type` (or, without one, its keywords).
    fn typed(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        let has_props = o.contains_key("properties")
            || o.get("additionalProperties")
                .is_some_and(|a| *a != Value::Bool(true));
        let stringy = ["pattern", "minLength", "maxLength"]
            .iter()
            .any(|k| o.contains_key(*k))
            || pattern::known_format(o);
        match o.get("type").and_then(Value::as_str) {
            None if has_props => self.object(o, at, depth),
            None if o.contains_key("allOf") => self.all_of(o, at, depth),
            None if o.contains_key("items") || o.contains_key("prefixItems") => {
                self.array(o, at, depth)
            }
            None if stringy => string(o, at),
            None => only(
                o,
                at,
                &[],
                Emits::Any,
                "the grammar writes any JSON value here",
            ),
            Some("object") if !has_props && o.contains_key("allOf") => self.all_of(o, at, depth),
            Some("object") => self.object(o, at, depth),
            Some("string") if o.contains_key("allOf") => self.all_of(o, at, depth),
            Some("string") => string(o, at),
            Some("array") => self.array(o, at, depth),
            Some("integer") => integer(o, at),
            Some("number") => only(
                o,
                at,
                &["type"],
                Emits::Number,
                "the grammar cannot bound a number (an integer's bounds it can)",
            ),
            Some("boolean") => only(o, at, &["type"], Emits::Boolean, "a boolean"),
            Some("null") => only(o, at, &["type"], Emits::Null, "null"),
            // An unknown type: the converter refuses it by itself.
            Some(_) => Ok(()),
        }
    }

    /// An object: its properties, which required, what else it may hold.
    fn object(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        only(
            o,
            at,
            &["type", "properties", "required", "additionalProperties"],
            Emits::Object,
            "an object",
        )?;
        let props = o.get("properties").and_then(Value::as_object);
        for name in o
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let defined = name
                .as_str()
                .is_some_and(|n| props.is_some_and(|p| p.contains_key(n)));
            if !defined {
                let why = format!("{name} is not among the properties, and the grammar requires only properties it writes");
                return Err(refuse(at, "required", RefusalKind::Unsupported, why));
            }
        }
        for (name, p) in props.into_iter().flatten() {
            self.node(p, &format!("{at}/properties/{}", escape(name)), depth + 1)?;
        }
        match o.get("additionalProperties") {
            Some(a @ Value::Object(_)) => {
                self.node(a, &format!("{at}/additionalProperties"), depth + 1)
            }
            _ => Ok(()),
        }
    }

    /// An array: a list of `items` within `minItems`..`maxItems`, or a tuple.
    fn array(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        let honoured = [
            "type",
            "items",
            "prefixItems",
            "minItems",
            "maxItems",
            "additionalItems",
        ];
        only(o, at, &honoured, Emits::Array, "an array")?;
        if o.contains_key("items") && o.contains_key("prefixItems") {
            let why = "beside items the grammar drops prefixItems".to_string();
            return Err(refuse(at, "prefixItems", RefusalKind::Unsupported, why));
        }
        let (key, items) = match (o.get("items"), o.get("prefixItems")) {
            (Some(i), _) => ("items", i),
            (None, Some(p)) => ("prefixItems", p),
            (None, None) => return count_bounds(o, at, "minItems", "maxItems").map(drop),
        };
        let Value::Array(tuple) = items else {
            count_bounds(o, at, "minItems", "maxItems")?;
            return self.node(items, &format!("{at}/{key}"), depth + 1);
        };
        // A tuple is written with exactly its items, whatever the bounds say.
        let n = tuple.len() as u64;
        let (min, max) = count_bounds(o, at, "minItems", "maxItems")?;
        if min > n || max.is_some_and(|m| m < n) {
            let kw = if min > n { "minItems" } else { "maxItems" };
            let why = format!(
                "the grammar writes the {n} items of {key} exactly, which this bound refuses"
            );
            return Err(refuse(at, kw, RefusalKind::Unsupported, why));
        }
        for (i, item) in tuple.iter().enumerate() {
            self.node(item, &format!("{at}/{key}/{i}"), depth + 1)?;
        }
        Ok(())
    }
}

/// `oneOf` or `anyOf` and its alternatives (oneOf first, as the converter).
fn alternatives(o: &Map<String, Value>) -> Option<(&'static str, &Vec<Value>)> {
    ["oneOf", "anyOf"]
        .into_iter()
        .find_map(|k| o.get(k).and_then(Value::as_array).map(|l| (k, l)))
}

/// A string: a pattern, a known format, or a length range.
fn string(o: &Map<String, Value>, at: &str) -> Result<(), SchemaRefusal> {
    if let Some(p) = o.get("pattern") {
        only(
            o,
            at,
            &["type", "pattern"],
            Emits::String,
            "beside a pattern the grammar follows only the pattern",
        )?;
        let Some(p) = p.as_str() else {
            return Ok(()); // the converter refuses it
        };
        return pattern::check(p).map_err(|(kind, why)| refuse(at, "pattern", kind, why));
    }
    if pattern::known_format(o) {
        return only(
            o,
            at,
            &["type"],
            Emits::String,
            "beside this format the grammar writes only the format",
        );
    }
    only(
        o,
        at,
        &["type", "minLength", "maxLength"],
        Emits::String,
        "a string",
    )?;
    count_bounds(o, at, "minLength", "maxLength").map(drop)
}

/// An integer within its bounds.
fn integer(o: &Map<String, Value>, at: &str) -> Result<(), SchemaRefusal> {
    let honoured = [
        "type",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    ];
    only(o, at, &honoured, Emits::Number, "an integer")?;
    let lo = kinds::int_bound(o, at, "minimum", "exclusiveMinimum", true)?;
    let hi = kinds::int_bound(o, at, "maximum", "exclusiveMaximum", false)?;
    match (lo, hi) {
        (Some((lo, lo_kw)), Some((hi, kw))) if lo > hi => {
            let why = format!("no integer is at least {lo} ({lo_kw}) and at most {hi} ({kw})");
            Err(refuse(at, kw, RefusalKind::Empty, why))
        }
        _ => Ok(()),
    }
}

/// `o`'s count bounds `min_kw`..`max_kw` (minLength/maxLength,
/// minItems/maxItems): crossed, or beyond [`MAX_REPEAT`] ([`MAX_ITEMS`]
/// for items), refused.
fn count_bounds(
    o: &Map<String, Value>,
    at: &str,
    min_kw: &str,
    max_kw: &str,
) -> Result<(u64, Option<u64>), SchemaRefusal> {
    let min = o.get(min_kw).and_then(Value::as_u64).unwrap_or(0);
    let max = o.get(max_kw).and_then(Value::as_u64);
    let cap = if min_kw == "minItems" {
        MAX_ITEMS
    } else {
        MAX_REPEAT
    };
    for (kw, n) in [(min_kw, Some(min)), (max_kw, max)] {
        if n.is_some_and(|n| n > cap) {
            let why = format!(
                "{} is above {cap}, the most repetitions llama.cpp's grammar holds here",
                n.unwrap_or_default()
            );
            return Err(refuse(at, kw, RefusalKind::TooLarge, why));
        }
    }
    if let Some(max) = max.filter(|&m| m < min) {
        let why = format!("{min_kw} {min} is above {max_kw} {max}: nothing satisfies both");
        return Err(refuse(at, min_kw, RefusalKind::Empty, why));
    }
    Ok((min, max))
}

/// Refuse the keywords of `o` outside `honoured` that constrain what a
/// reading emitting `emits` writes (`what` says why they are dropped).
fn only(
    o: &Map<String, Value>,
    at: &str,
    honoured: &[&str],
    emits: Emits,
    what: &str,
) -> Result<(), SchemaRefusal> {
    for (kw, v) in o {
        if honoured.contains(&kw.as_str()) || vacuous(kw, v) {
            continue;
        }
        let constrains = match applies(kw) {
            Applies::Nothing => false,
            Applies::All => true,
            Applies::Only(t) => emits.includes(t),
        };
        if constrains {
            let why = format!(
                "the grammar drops this keyword here ({what}); drop it or restructure the schema"
            );
            return Err(refuse(at, kw, RefusalKind::Unsupported, why));
        }
    }
    Ok(())
}

/// A keyword whose value constrains nothing.
fn vacuous(kw: &str, v: &Value) -> bool {
    match kw {
        "uniqueItems" => *v == Value::Bool(false),
        "minProperties" => v.as_u64() == Some(0),
        _ => false,
    }
}

/// `name` as a JSON-pointer step.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
#[path = "schema_check/tests.rs"]
mod tests;
