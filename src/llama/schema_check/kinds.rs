//! What a keyword applies to and what a reading of a sub-schema writes:
//! the JSON types involved, a `$ref` followed, an integer's bounds.

use serde_json::{Map, Value};

use super::refusal::{refuse, RefusalKind, SchemaRefusal};

/// A JSON type, as a bit in a set of them (an integer is a number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JsonType {
    Object = 1,
    Array = 2,
    String = 4,
    Number = 8,
    Boolean = 16,
    Null = 32,
}

const ALL: u8 = 63;

/// The values a keyword constrains.
pub(super) enum Applies {
    /// An annotation or a keyword unknown to JSON Schema.
    Nothing,
    /// Every value.
    All,
    /// Values of this type only.
    Only(JsonType),
}

/// The values one reading of the converter writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Emits {
    Any,
    Object,
    Array,
    String,
    Number,
    Boolean,
    Null,
}

impl Emits {
    pub(super) fn includes(self, t: JsonType) -> bool {
        let one = match self {
            Self::Any => return true,
            Self::Object => JsonType::Object,
            Self::Array => JsonType::Array,
            Self::String => JsonType::String,
            Self::Number => JsonType::Number,
            Self::Boolean => JsonType::Boolean,
            Self::Null => JsonType::Null,
        };
        one == t
    }
}

/// The values JSON Schema applies `kw` to.
pub(super) fn applies(kw: &str) -> Applies {
    use JsonType::*;
    match kw {
        "properties"
        | "required"
        | "additionalProperties"
        | "patternProperties"
        | "propertyNames"
        | "minProperties"
        | "maxProperties"
        | "dependentRequired"
        | "dependencies"
        | "dependentSchemas"
        | "unevaluatedProperties" => Applies::Only(Object),
        "items" | "prefixItems" | "additionalItems" | "minItems" | "maxItems" | "uniqueItems"
        | "contains" | "minContains" | "maxContains" | "unevaluatedItems" => Applies::Only(Array),
        "pattern" | "minLength" | "maxLength" => Applies::Only(String),
        "multipleOf" | "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
            Applies::Only(Number)
        }
        "type" | "enum" | "const" | "allOf" | "anyOf" | "oneOf" | "not" | "if" | "then"
        | "else" | "$ref" | "$dynamicRef" | "$recursiveRef" => Applies::All,
        _ => Applies::Nothing,
    }
}

/// `s` with its `$ref`s followed (a few deep) within `root`.
pub(super) fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    let mut s = s;
    for _ in 0..8 {
        let target = s
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|p| root.pointer(p));
        match target {
            Some(t) => s = t,
            None => break,
        }
    }
    s
}

/// An object schema of properties alone (what `allOf` can merge).
pub(super) fn object_like(o: &Map<String, Value>) -> bool {
    let keys_ok = o.iter().all(|(k, v)| match k.as_str() {
        "type" => v == "object",
        "properties" => v.is_object(),
        "required" | "additionalProperties" => true,
        k => matches!(applies(k), Applies::Nothing),
    });
    keys_ok && o.contains_key("properties")
}

/// The JSON types `s`'s grammar may write, as bits of [`JsonType`].
fn types(root: &Value, s: &Value, depth: usize) -> u8 {
    let s = resolve(root, s);
    if depth > 16 {
        return ALL;
    }
    let of_value = |v: &Value| match v {
        Value::Object(_) => JsonType::Object as u8,
        Value::Array(_) => JsonType::Array as u8,
        Value::String(_) => JsonType::String as u8,
        Value::Number(_) => JsonType::Number as u8,
        Value::Bool(_) => JsonType::Boolean as u8,
        Value::Null => JsonType::Null as u8,
    };
    let of_name = |t: &Value| match t.as_str() {
        Some("object") => JsonType::Object as u8,
        Some("array") => JsonType::Array as u8,
        Some("string") => JsonType::String as u8,
        Some("number" | "integer") => JsonType::Number as u8,
        Some("boolean") => JsonType::Boolean as u8,
        Some("null") => JsonType::Null as u8,
        _ => ALL,
    };
    if let Some(alts) = ["oneOf", "anyOf"]
        .iter()
        .find_map(|k| s.get(*k).and_then(Value::as_array))
    {
        return alts
            .iter()
            .fold(0, |acc, a| acc | types(root, a, depth + 1));
    }
    match (s.get("const"), s.get("enum"), s.get("type")) {
        (Some(c), _, _) => of_value(c),
        (None, Some(Value::Array(l)), _) => l.iter().fold(0, |acc, v| acc | of_value(v)),
        (None, None, Some(Value::Array(l))) => l.iter().fold(0, |acc, t| acc | of_name(t)),
        (None, None, Some(t)) => of_name(t),
        _ if s.get("properties").is_some() => JsonType::Object as u8,
        _ if s.get("items").is_some() || s.get("prefixItems").is_some() => JsonType::Array as u8,
        _ => ALL,
    }
}

/// Whether no document can match two of `alts` (`oneOf` read as `anyOf`
/// is then exact): their types are apart, or each is an object requiring a
/// property whose `const` tells them apart.
pub(super) fn disjoint(root: &Value, alts: &[Value]) -> bool {
    let sets: Vec<u8> = alts.iter().map(|a| types(root, a, 0)).collect();
    let apart = sets
        .iter()
        .enumerate()
        .all(|(i, a)| sets[i + 1..].iter().all(|b| a & b == 0));
    apart || discriminated(root, alts)
}

/// Each of `alts` an object requiring one same property, with a distinct
/// `const` in each.
fn discriminated(root: &Value, alts: &[Value]) -> bool {
    let alts: Vec<&Value> = alts.iter().map(|a| resolve(root, a)).collect();
    let Some(first) = alts
        .first()
        .and_then(|a| a.get("properties"))
        .and_then(Value::as_object)
    else {
        return false;
    };
    first.keys().any(|key| {
        let tags: Option<Vec<&Value>> = alts
            .iter()
            .map(|a| {
                let required = a["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|n| n == key.as_str()));
                let tag = resolve(root, &a["properties"][key]).get("const");
                tag.filter(|_| required)
            })
            .collect();
        tags.is_some_and(|t| {
            t.iter()
                .enumerate()
                .all(|(i, a)| t[i + 1..].iter().all(|b| a != b))
        })
    })
}

/// The most an integral bound may be: beyond it a JSON number is not an
/// exact integer, and the converter's 64-bit arithmetic overflows.
const MAX_BOUND: f64 = 9_007_199_254_740_992.0;

/// An integer's lower (`lower`) or upper bound from `incl` and `excl`
/// (minimum/exclusiveMinimum or maximum/exclusiveMaximum): the tighter,
/// with the keyword that sets it. The converter reads only `incl` when both
/// are there, so an `excl` that is tighter is refused.
pub(super) fn int_bound(
    o: &Map<String, Value>,
    at: &str,
    incl: &'static str,
    excl: &'static str,
    lower: bool,
) -> Result<Option<(i64, &'static str)>, SchemaRefusal> {
    let mut bounds = Vec::new();
    for (kw, exclusive) in [(incl, false), (excl, true)] {
        let Some(v) = o.get(kw) else { continue };
        let Some(x) = v.as_f64() else {
            if exclusive {
                let why = "a boolean exclusive bound (draft 4) the grammar drops: give the bound as a number".to_string();
                return Err(refuse(at, kw, RefusalKind::Unsupported, why));
            }
            return Ok(None); // the converter refuses it
        };
        if x.abs() > MAX_BOUND {
            let why = format!("{x} is beyond ±2^53, where the grammar's integer bounds stop");
            return Err(refuse(at, kw, RefusalKind::TooLarge, why));
        }
        let n = match (lower, exclusive) {
            (true, false) => x.ceil(),
            (true, true) => x.floor() + 1.0,
            (false, false) => x.floor(),
            (false, true) => x.ceil() - 1.0,
        } as i64;
        bounds.push((n, kw));
    }
    let tightest = bounds
        .iter()
        .copied()
        .reduce(|a, b| if (a.0 < b.0) == lower { b } else { a });
    if let (Some(&(read, _)), Some((tight, kw))) = (bounds.first(), tightest) {
        if bounds.len() == 2 && read != tight {
            let why = format!("beside {incl} the grammar drops {excl}, which is tighter");
            return Err(refuse(at, kw, RefusalKind::Unsupported, why));
        }
    }
    Ok(tightest)
}
