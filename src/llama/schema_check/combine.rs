//! `allOf` and the values of `const` and `enum`: what the converter merges
//! or writes literally, checked against the schema around them.

use serde_json::{Map, Value};

use super::kinds::{self, Emits};
use super::refusal::{refuse, RefusalKind, SchemaRefusal};
use super::refusal::{MAX_ENUM_BYTES, MAX_ENUM_VALUES};
use super::{escape, only, Walk};

impl Walk<'_> {
    /// `allOf`: the converter merges its members' properties (all of them
    /// required) or intersects their enums; nothing else.
    pub(super) fn all_of(
        &mut self,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        let emits = if o.get("type").and_then(Value::as_str) == Some("string") {
            Emits::String
        } else {
            Emits::Object
        };
        only(
            o,
            at,
            &["type", "allOf"],
            emits,
            "beside allOf the grammar reads only its members",
        )?;
        let Some(Value::Array(members)) = o.get("allOf") else {
            return Ok(());
        };
        let resolved: Vec<&Value> = members
            .iter()
            .map(|m| kinds::resolve(self.root, m))
            .collect();
        if !resolved.is_empty() && resolved.iter().all(|m| m.get("enum").is_some()) {
            return self.enum_intersection(o, &resolved, at);
        }
        if emits == Emits::String {
            let why = "under type string the grammar merges only enums".to_string();
            return Err(refuse(at, "allOf", RefusalKind::Unsupported, why));
        }
        self.merged_objects(&resolved, at, depth)
    }

    /// `allOf`'s members merged as the converter merges them: objects of
    /// properties, each property defined once (or alike), every required
    /// name defined; and the properties' own check.
    fn merged_objects(
        &mut self,
        members: &[&Value],
        at: &str,
        depth: usize,
    ) -> Result<(), SchemaRefusal> {
        let no = |why: String| Err(refuse(at, "allOf", RefusalKind::Unsupported, why));
        let mut seen: Map<String, Value> = Map::new();
        for (i, m) in members.iter().enumerate() {
            let Some(mo) = m.as_object().filter(|mo| kinds::object_like(mo)) else {
                return no("the grammar merges only members that are objects with properties (or all enums)".into());
            };
            if members.len() > 1 && mo.get("additionalProperties") == Some(&Value::Bool(false)) {
                return no(
                    "a member forbids additional properties, which the other members add".into(),
                );
            }
            let props = mo.get("properties").and_then(Value::as_object);
            for (name, p) in props.into_iter().flatten() {
                if seen.get(name).is_some_and(|q| q != p) {
                    return no(format!(
                        "members define property {name:?} differently, and the grammar keeps one"
                    ));
                }
                seen.insert(name.clone(), p.clone());
                let here = format!("{at}/allOf/{i}/properties/{}", escape(name));
                self.node(p, &here, depth + 1)?;
            }
        }
        let required = members.iter().flat_map(|m| {
            m.get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        });
        for name in required {
            if !name.as_str().is_some_and(|n| seen.contains_key(n)) {
                return no(format!("{name} is required but no member defines it"));
            }
        }
        Ok(())
    }

    /// An `allOf` of enums: their common values, each valid against `o`.
    fn enum_intersection(
        &self,
        o: &Map<String, Value>,
        members: &[&Value],
        at: &str,
    ) -> Result<(), SchemaRefusal> {
        for m in members {
            enum_size(m["enum"].as_array().map_or(&[], Vec::as_slice), at, "allOf")?;
        }
        let first = members[0]["enum"].as_array().cloned().unwrap_or_default();
        let common: Vec<Value> = first
            .into_iter()
            .filter(|v| {
                members
                    .iter()
                    .all(|m| m["enum"].as_array().is_some_and(|l| l.contains(v)))
            })
            .collect();
        if common.is_empty() {
            let why =
                "the members' enums share no value: no document satisfies them all".to_string();
            return Err(refuse(at, "allOf", RefusalKind::Empty, why));
        }
        self.valid_values(o, &common, at, "allOf")
    }

    /// `const` or `enum`: the converter writes their values and drops every
    /// other keyword, so each value must be valid against the whole `o`.
    pub(super) fn values(&self, o: &Map<String, Value>, at: &str) -> Result<(), SchemaRefusal> {
        let (key, values) = match (o.get("const"), o.get("enum")) {
            (Some(c), _) => ("const", vec![c.clone()]),
            (None, Some(Value::Array(l))) => ("enum", l.clone()),
            // A malformed enum: the converter refuses it by itself.
            _ => return Ok(()),
        };
        enum_size(&values, at, key)?;
        self.valid_values(o, &values, at, key)
    }

    /// Each of `values` valid against `o` (with the root's definitions).
    fn valid_values(
        &self,
        o: &Map<String, Value>,
        values: &[Value],
        at: &str,
        key: &str,
    ) -> Result<(), SchemaRefusal> {
        let mut schema = o.clone();
        for defs in ["$defs", "definitions"] {
            if let (Some(d), false) = (self.root.get(defs), schema.contains_key(defs)) {
                schema.insert(defs.into(), d.clone());
            }
        }
        let validator = jsonschema::validator_for(&Value::Object(schema)).map_err(|e| {
            refuse(
                at,
                key,
                RefusalKind::Unsupported,
                format!("the schema around it does not compile: {e}"),
            )
        })?;
        match values.iter().find(|v| !validator.is_valid(v)) {
            None => Ok(()),
            Some(v) => {
                let why = format!("{v} is not valid against the schema that offers it (its other keywords), so no document is both");
                Err(refuse(at, key, RefusalKind::Empty, why))
            }
        }
    }
}

/// `values` (an enum's, a const's) within [`MAX_ENUM_VALUES`] and
/// [`MAX_ENUM_BYTES`].
fn enum_size(values: &[Value], at: &str, key: &str) -> Result<(), SchemaRefusal> {
    let bytes: usize = values.iter().map(|v| v.to_string().len()).sum();
    if values.len() <= MAX_ENUM_VALUES && bytes <= MAX_ENUM_BYTES {
        return Ok(());
    }
    let why = format!(
        "{} values in {bytes} bytes: the grammar holds at most {MAX_ENUM_VALUES} values in {MAX_ENUM_BYTES} bytes (each one a path the sampler walks at every token)",
        values.len()
    );
    Err(refuse(at, key, RefusalKind::TooLarge, why))
}
