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
mod json;
mod jsonl;
mod npy;
pub mod spellings;
#[cfg(test)]
mod tests;
mod types;

use collect::Collector;
pub use collect::Sizes;
pub use types::{ImportError, ImportFormat, Imported, Loc, Summary};

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
