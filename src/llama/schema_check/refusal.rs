//! Why a schema is refused, and the bounds a schema must keep within.

/// The most repetitions llama.cpp's GBNF parser takes (its
/// `MAX_REPETITION_THRESHOLD`): above it a `{m,n}`'s `n` is silently
/// dropped (unbounded) and a `m` is a parse error.
pub const MAX_REPEAT: u64 = 2000;
/// The most items `minItems`/`maxItems` may ask for: an item repeats with
/// its separator, a group of up to three rules, and llama.cpp bounds rules
/// times repetitions by 2000 (`maxItems` 1000 of strings with a `maxLength` failed its parse).
pub const MAX_ITEMS: u64 = 500;
/// The most values an `enum` may offer: each is a grammar stack the sampler
/// walks at every token (100k values decoded at 0.25 tok/s).
pub const MAX_ENUM_VALUES: usize = 256;
/// The most bytes of JSON an `enum`'s or `const`'s values may take together.
pub const MAX_ENUM_BYTES: usize = 16 * 1024;
/// The most sub-schemas one schema may hold.
pub const MAX_NODES: usize = 4096;
/// The deepest a sub-schema may sit.
pub const MAX_DEPTH: usize = 64;
/// The most bytes a `pattern` may take.
pub const MAX_PATTERN_BYTES: usize = 4096;

/// Why a schema is refused before any grammar is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{keyword}\" at #{pointer}: {why}")]
pub struct SchemaRefusal {
    /// The JSON pointer of the sub-schema holding the keyword ("" the root).
    pub pointer: String,
    pub keyword: String,
    pub why: String,
    pub kind: RefusalKind,
}

/// What kind of refusal: a schema no document satisfies and one too large
/// are a client's error everywhere; one the grammar cannot honour may still
/// be offered as a tool under `tool_choice` `auto` (left unconstrained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// No document satisfies the keyword (bounds crossed, empty ranges).
    Empty,
    /// Beyond a bound on grammar size ([`MAX_REPEAT`], [`MAX_ENUM_VALUES`], ...).
    TooLarge,
    /// The grammar cannot honour the keyword.
    Unsupported,
}

/// A refusal of `keyword` at JSON pointer `at`.
pub(super) fn refuse(at: &str, keyword: &str, kind: RefusalKind, why: String) -> SchemaRefusal {
    SchemaRefusal {
        pointer: at.to_string(),
        keyword: keyword.to_string(),
        why,
        kind,
    }
}
