//! What an import reads and gives: the input's format, a place in it, why
//! it cannot be read, and the trace with its summary.

use std::fmt;
use std::str::FromStr;

use crate::route_trace::{TraceHeader, TraceRecord};

/// The input's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportFormat {
    /// Told apart by the first bytes ([`super::detect`]).
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
