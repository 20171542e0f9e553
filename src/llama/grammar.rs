//! llama.cpp's grammar sampler and its JSON-schema converter, behind safe
//! types: a [`Grammar`] (GBNF text, and the trigger patterns that wake a
//! lazy one), a JSON schema turned into GBNF ([`schema_to_gbnf`]), and the
//! sampler built from a grammar on a model's vocabulary ([`GrammarSampler`]).

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;
use serde_json::Value;

use super::schema_check::{schema_check, RefusalKind, SchemaRefusal};

/// The root rule every grammar here starts from.
pub const ROOT: &str = "root";

/// The most GBNF text one request's grammar may take (the converter's
/// output for a schema that passed [`schema_check`]; several tools' together).
pub const MAX_GBNF_BYTES: usize = 1024 * 1024;

/// Why a schema or grammar cannot constrain a generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error(
        "the JSON schema{at} cannot be turned into a grammar (llama.cpp's json-schema-to-grammar \
         refuses {part}); simplify that part of the schema"
    )]
    Schema { at: String, part: String },
    #[error("the JSON schema cannot constrain the reply: {0}")]
    Refused(#[from] SchemaRefusal),
    #[error(
        "the grammar built from the schema takes {bytes} bytes, above the {MAX_GBNF_BYTES} a \
         request may ask the sampler to walk; simplify the schema"
    )]
    TooLarge { bytes: usize },
    #[error("the grammar holds a NUL byte")]
    Nul,
    #[error("llama.cpp could not parse the grammar (a bug in bmoe): {0}")]
    Parse(String),
}

/// A GBNF grammar whose root rule is [`ROOT`]; `triggers` (regular
/// expressions) make it lazy: free text until one matches, the grammar from
/// where it matched on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grammar {
    pub gbnf: String,
    pub triggers: Vec<String>,
}

impl Grammar {
    /// Output that is JSON valid against `schema`.
    pub fn json(schema: &Value) -> Result<Self, GrammarError> {
        Ok(Self {
            gbnf: schema_to_gbnf(schema)?,
            triggers: Vec::new(),
        })
    }

    /// Whether llama.cpp parses this grammar (no vocabulary needed), once
    /// it is within [`MAX_GBNF_BYTES`].
    pub fn check(&self) -> Result<(), GrammarError> {
        self.bounded()?;
        GrammarSampler::new(std::ptr::null(), self).map(drop)
    }

    /// Whether the grammar is within [`MAX_GBNF_BYTES`].
    pub fn bounded(&self) -> Result<(), GrammarError> {
        match self.gbnf.len() {
            bytes if bytes > MAX_GBNF_BYTES => Err(GrammarError::TooLarge { bytes }),
            _ => Ok(()),
        }
    }
}

impl GrammarError {
    /// Whether the error is the client's wherever the schema comes from: a
    /// schema no document satisfies (no call of that tool could be valid).
    /// One too large to build, or that the grammar cannot honour, only
    /// where a call is forced: under `tool_choice` `auto` the calls are then
    /// left unconstrained (agents offer tools such as a script parameter of
    /// `maxLength` 524288, and their requests must be answered).
    pub fn refused_everywhere(&self) -> bool {
        matches!(self, Self::Refused(r) if r.kind == RefusalKind::Empty)
    }
}

/// `schema` as GBNF (root rule [`ROOT`]), through llama.cpp's converter,
/// once [`schema_check`] passes it (a refusal names the keyword), within
/// [`MAX_GBNF_BYTES`]. A refusal of the converter's names the deepest part
/// of the schema that it refuses on its own.
pub fn schema_to_gbnf(schema: &Value) -> Result<String, GrammarError> {
    schema_check(schema)?;
    let gbnf = convert(schema).ok_or_else(|| {
        let (at, part) = refused_part(schema, schema, String::new());
        GrammarError::Schema {
            at: if at.is_empty() {
                String::new()
            } else {
                format!(" at {at}")
            },
            part: format!("{:.120}", part.to_string()),
        }
    })?;
    match gbnf.len() {
        bytes if bytes > MAX_GBNF_BYTES => Err(GrammarError::TooLarge { bytes }),
        _ => Ok(gbnf),
    }
}

/// The converter's GBNF for `schema`, None when it refuses.
fn convert(schema: &Value) -> Option<String> {
    let text = CString::new(schema.to_string()).ok()?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `text` is a NUL-terminated string alive for the call; `out`
    // is a valid place for the result pointer, which the wrapper allocates.
    let status = unsafe { sys::llama_rs_json_schema_to_grammar(text.as_ptr(), true, &mut out) };
    if out.is_null() {
        return None;
    }
    // SAFETY: on success `out` is the wrapper's NUL-terminated copy, read
    // before it is freed once with the wrapper's own free.
    let gbnf = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above: allocated by the wrapper, freed once here.
    unsafe { sys::llama_rs_string_free(out) };
    (status == sys::LLAMA_RS_STATUS_OK).then_some(gbnf)
}

/// The deepest sub-schema under `schema` (at JSON pointer `at`) that the
/// converter refuses by itself (with `root`'s definitions beside it, so that
/// a reference to them resolves): its pointer and the sub-schema.
fn refused_part(root: &Value, schema: &Value, at: String) -> (String, Value) {
    for (key, child) in children(schema) {
        let path = format!("{at}/{key}");
        if child.is_object() && convert(&with_defs(child, root)).is_none() {
            return refused_part(root, child, path);
        }
    }
    (at, schema.clone())
}

/// `child` with `root`'s `$defs` and `definitions` (those it lacks).
fn with_defs(child: &Value, root: &Value) -> Value {
    let mut out = child.clone();
    if let Value::Object(o) = &mut out {
        for key in ["$defs", "definitions"] {
            if let (Some(defs), false) = (root.get(key), o.contains_key(key)) {
                o.insert(key.into(), defs.clone());
            }
        }
    }
    out
}

/// The sub-schemas of `schema`, with their JSON-pointer steps.
fn children(schema: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for key in ["items", "additionalProperties", "not"] {
        out.extend(schema.get(key).map(|c| (key.to_string(), c)));
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(m)) = schema.get(key) {
            out.extend(m.iter().map(|(k, c)| (format!("{key}/{k}"), c)));
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(l)) = schema.get(key) {
            out.extend(l.iter().enumerate().map(|(i, c)| (format!("{key}/{i}"), c)));
        }
    }
    out
}

/// A grammar sampler on a vocabulary (owned; freed on drop).
pub(crate) struct GrammarSampler(NonNull<sys::llama_sampler>);

impl GrammarSampler {
    /// The sampler for `g` on `vocab` (null: parse only, never sample).
    pub(crate) fn new(vocab: *const sys::llama_vocab, g: &Grammar) -> Result<Self, GrammarError> {
        let gbnf = CString::new(g.gbnf.as_str()).map_err(|_| GrammarError::Nul)?;
        let root = CString::new(ROOT).map_err(|_| GrammarError::Nul)?;
        let triggers = g
            .triggers
            .iter()
            .map(|t| CString::new(t.as_str()).map_err(|_| GrammarError::Nul))
            .collect::<Result<Vec<_>, _>>()?;
        let mut ptrs: Vec<*const c_char> = triggers.iter().map(|t| t.as_ptr()).collect();
        let ptr = if ptrs.is_empty() {
            // SAFETY: NUL-terminated strings alive for the call, which
            // copies them; `vocab` is a model's vocabulary or null.
            unsafe { sys::llama_rs_sampler_init_grammar(vocab, gbnf.as_ptr(), root.as_ptr()) }
        } else {
            // SAFETY: as above; `ptrs` holds `ptrs.len()` pointers to
            // strings alive for the call (copied); no trigger tokens.
            unsafe {
                sys::llama_rs_sampler_init_grammar_lazy_patterns(
                    vocab,
                    gbnf.as_ptr(),
                    root.as_ptr(),
                    ptrs.as_mut_ptr(),
                    ptrs.len(),
                    std::ptr::null(),
                    0,
                )
            }
        };
        NonNull::new(ptr).map(Self).ok_or_else(|| {
            GrammarError::Parse(g.gbnf.lines().take(3).collect::<Vec<_>>().join(" / "))
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_sampler {
        self.0.as_ptr()
    }
}

impl Drop for GrammarSampler {
    fn drop(&mut self) {
        // SAFETY: created by llama.cpp's grammar constructor, freed once here.
        unsafe { sys::llama_sampler_free(self.0.as_ptr()) }
    }
}

/// `text` as a regular expression matching it literally (ECMAScript).
pub fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_becomes_gbnf_with_a_root_rule_that_llama_cpp_parses() {
        let g = Grammar::json(&json!({"type": "object",
            "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
        .unwrap();
        assert!(g.gbnf.contains("root ::="), "{}", g.gbnf);
        g.check().unwrap();
        let lazy = Grammar {
            triggers: vec![regex_escape("<tool_call>")],
            ..g
        };
        lazy.check().unwrap();
    }

    #[test]
    fn a_refused_schema_names_the_part_refused() {
        let schema = json!({"type": "object", "properties": {
            "ok": {"type": "string"},
            "bad": {"$ref": "#/$defs/missing"}}});
        let e = schema_to_gbnf(&schema).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("at /properties/bad"), "{text}");
        assert!(text.contains("#/$defs/missing"), "{text}");
    }

    /// A reference to the schema's own definitions is not blamed: the part
    /// refused is the one that is refused with the definitions in reach.
    #[test]
    fn a_sound_reference_is_not_blamed_for_a_refusal_elsewhere() {
        let schema = json!({"type": "object",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"a": {"$ref": "#/$defs/n"},
                "b": {"type": "object", "properties": {"c": {"$ref": "#/$defs/gone"}}}}});
        let text = schema_to_gbnf(&schema).unwrap_err().to_string();
        assert!(text.contains("at /properties/b/properties/c "), "{text}");
        let fine = json!({"type": "object", "$defs": {"n": {"type": "integer"}},
            "properties": {"a": {"$ref": "#/$defs/n"}}});
        schema_to_gbnf(&fine).unwrap();
    }

    #[test]
    fn a_broken_grammar_is_an_error_not_a_crash() {
        let g = Grammar {
            gbnf: "root ::= nowhere".into(),
            triggers: Vec::new(),
        };
        assert!(matches!(g.check(), Err(GrammarError::Parse(_))));
    }

    #[test]
    fn regex_escape_quotes_every_special_character() {
        assert_eq!(regex_escape("<|a.b|>"), "<\\|a\\.b\\|>");
        assert_eq!(regex_escape("[TOOL_CALLS]"), "\\[TOOL_CALLS\\]");
    }
}
