//! `bmoe trace import`: routing logs written by other tools turned into route
//! trace records ([`crate::route_trace`]), so `bmoe replay` can size the cache
//! for a model from a published log instead of a run.
//!
//! Inputs ([`ImportFormat`]):
//! - JSONL: one object per (token, layer) with a flat list of expert ids and
//!   a layer field, or one per token with a list per layer. The field names
//!   vary between tools; the first record's spelling ([`spellings`]) is the
//!   file's, and every record must use it.
//! - A routed-experts array (vLLM, SGLang): a JSON nested array
//!   `[tokens][layers][k]`, bare or under a key, or the same as a `.npy`.
//! - A CSV of `layer,expert` rows (llama.cpp-style), optionally with a
//!   token column and a weight column.
//!
//! Every token becomes one demand per layer with its k ids (layers in
//! ascending order), its router weights when the input has them, then a
//! decode end of one row with one output: a token-by-token generation.

mod array;
mod collect;
mod csv;
mod jsonl;
mod npy;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use crate::route_trace::{TraceHeader, TraceRecord};
use collect::Route;

use collect::Collector;
pub use collect::Sizes;

/// The field names each kind of value goes by in the wild, in the order
/// they are tried.
pub mod spellings {
    /// A route's expert ids.
    pub const IDS: [&str; 4] = ["experts", "expert_ids", "topk_ids", "selected_experts"];
    /// A route's router weights.
    pub const WEIGHTS: [&str; 5] = [
        "weights",
        "gating_probs",
        "topk_weights",
        "router_weights",
        "probs",
    ];
    /// The token's index or position.
    pub const TOKEN: [&str; 5] = ["token_idx", "token_pos", "token", "position", "pos"];
    /// The layer's index.
    pub const LAYER: [&str; 3] = ["layer", "layer_idx", "layer_id"];
}

/// The input's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportFormat {
    /// Told apart by the first bytes ([`detect`]).
    Auto,
    Jsonl,
    /// A nested array `[tokens][layers][k]`: JSON or `.npy`.
    Array,
    Csv,
}

impl ImportFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Jsonl => "jsonl",
            Self::Array => "array",
            Self::Csv => "csv",
        }
    }
}

impl FromStr for ImportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Auto, Self::Jsonl, Self::Array, Self::Csv]
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown format {s:?} (expected auto, jsonl, array or csv)"))
    }
}

/// Where in the input a fault is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// A line of a text input (1-based).
    Line(u64),
    /// A byte offset into a binary input.
    Byte(u64),
    /// A route of a nested array (0-based indices).
    Entry { token: u64, layer: u32 },
    /// The input as a whole.
    Input,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Line(n) => write!(f, "line {n}"),
            Self::Byte(n) => write!(f, "byte {n}"),
            Self::Entry { token, layer } => write!(f, "token {token}, layer {layer}"),
            Self::Input => write!(f, "the input"),
        }
    }
}

/// Why an input cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{at}: {what}")]
    Bad { at: Loc, what: String },
}

impl ImportError {
    pub(crate) fn at(at: Loc, what: impl Into<String>) -> Self {
        Self::Bad {
            at,
            what: what.into(),
        }
    }
}

/// What was imported, for the summary line.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The format read (never Auto).
    pub format: ImportFormat,
    pub tokens: u64,
    /// Distinct layers routed.
    pub layers: u32,
    pub k: u32,
    pub n_expert: u32,
    /// The field names or columns the input used.
    pub spelling: String,
    /// Whether router weights were kept.
    pub weights: bool,
    /// Anything the import decided that the user should know.
    pub notes: Vec<String>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "imported {} tokens x {} layers, k {}, {} experts ({}: {}); router weights {}",
            self.tokens,
            self.layers,
            self.k,
            self.n_expert,
            self.format.name(),
            self.spelling,
            if self.weights { "kept" } else { "absent" }
        )
    }
}

/// A whole imported trace.
#[derive(Debug, Clone)]
pub struct Imported {
    pub header: TraceHeader,
    pub records: Vec<TraceRecord>,
    pub summary: Summary,
}

/// Turn `input` (a whole file) into a trace with the expert sizes `sizes`.
/// A UTF-8 byte order mark (some editors and Windows tools start text with
/// one) is skipped before the format is told and the text parsed.
pub fn import(input: &[u8], format: ImportFormat, sizes: Sizes) -> Result<Imported, ImportError> {
    let input = input.strip_prefix(UTF8_BOM).unwrap_or(input);
    let format = match format {
        ImportFormat::Auto => detect(input)?,
        f => f,
    };
    let mut c = Collector::new(&sizes);
    let spelling = match format {
        ImportFormat::Jsonl => jsonl::parse(input, &mut c)?,
        ImportFormat::Array if input.starts_with(npy::MAGIC) => npy::parse(input, &mut c)?,
        ImportFormat::Array => array::parse(input, &mut c)?,
        ImportFormat::Csv => csv::parse(input, &mut c)?,
        ImportFormat::Auto => unreachable!("resolved above"),
    };
    c.finish(sizes, format, spelling)
}

/// The byte order mark UTF-8 text may start with.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The format from the first bytes (after a byte order mark): `.npy`'s magic or a `[` is an array; a
/// first line that is a whole JSON object is JSONL unless its ids are nested
/// three deep (an array under a key); other JSON is an array; the rest CSV.
pub fn detect(input: &[u8]) -> Result<ImportFormat, ImportError> {
    let input = input.strip_prefix(UTF8_BOM).unwrap_or(input);
    if input.starts_with(npy::MAGIC) {
        return Ok(ImportFormat::Array);
    }
    let text = input.trim_ascii_start();
    match text.first() {
        None => Err(ImportError::at(Loc::Input, "empty: no routes to import")),
        Some(b'[') => Ok(ImportFormat::Array),
        Some(b'{') => {
            let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
            match serde_json::from_slice::<serde_json::Value>(first) {
                Ok(v) if array::nested_ids(&v).is_some() => Ok(ImportFormat::Array),
                Ok(_) => Ok(ImportFormat::Jsonl),
                Err(_) => Ok(ImportFormat::Array),
            }
        }
        Some(_) => Ok(ImportFormat::Csv),
    }
}

/// The first of `names` that `obj` has.
pub(crate) fn pick(
    obj: &serde_json::Map<String, serde_json::Value>,
    names: &[&'static str],
) -> Option<&'static str> {
    names.iter().copied().find(|n| obj.contains_key(*n))
}

/// A JSON value as an expert id.
pub(crate) fn json_id(v: &serde_json::Value, at: Loc) -> Result<u32, ImportError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| ImportError::at(at, format!("expert id {v} is not a non-negative integer")))
}

/// A JSON value that must be an array (`what` names it in the error).
pub(crate) fn json_array<'a>(
    v: &'a serde_json::Value,
    what: &str,
    at: Loc,
) -> Result<&'a Vec<serde_json::Value>, ImportError> {
    v.as_array()
        .ok_or_else(|| ImportError::at(at, format!("{what} is {v}, not an array")))
}

/// One layer's route from its JSON ids and (optional) weights.
pub(crate) fn json_route(
    layer: u32,
    ids: &serde_json::Value,
    weights: Option<&serde_json::Value>,
    at: Loc,
) -> Result<Route, ImportError> {
    let ids = json_array(ids, "the expert ids", at)?
        .iter()
        .map(|v| json_id(v, at))
        .collect::<Result<Vec<_>, _>>()?;
    let weights = weights
        .map(|w| {
            json_array(w, "the router weights", at)?
                .iter()
                .map(|v| json_weight(v, at))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Route {
        layer,
        ids,
        weights,
    })
}

/// A JSON value as a router weight.
pub(crate) fn json_weight(v: &serde_json::Value, at: Loc) -> Result<f32, ImportError> {
    v.as_f64()
        .map(|w| w as f32)
        .filter(|w| w.is_finite())
        .ok_or_else(|| ImportError::at(at, format!("router weight {v} is not a finite number")))
}
