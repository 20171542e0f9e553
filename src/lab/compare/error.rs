//! What can go wrong reading or comparing telemetry CSVs.

use std::path::PathBuf;

/// Errors of reading or comparing telemetry CSVs.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {msg} (is this a `bmoe run --csv` file?)")]
    Format {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("{path} has no decode rows (a run of at least 2 tokens is needed)")]
    Empty { path: PathBuf },
    #[error(
        "{a} is {a_kind} and {b} is {b_kind}: speculated and plain runs measure different \
         things; pass --mixed to compare them anyway"
    )]
    Mixed {
        a: PathBuf,
        a_kind: String,
        b: PathBuf,
        b_kind: String,
    },
    #[error("give at least one CSV to compare")]
    NoRuns,
    #[error(
        "{path} is not a regular file (a directory, a FIFO or a device): give a CSV written by \
         `bmoe run --csv`"
    )]
    NotAFile { path: PathBuf },
}
