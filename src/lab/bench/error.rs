//! What can go wrong planning, running or summarizing a bench.

use std::path::{Path, PathBuf};

use crate::lab::compare;

/// Errors of planning, running or summarizing a bench.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{source_name}:{line}: {msg}")]
    Cells {
        source_name: String,
        line: usize,
        msg: String,
    },
    #[error("unknown preset {name:?}; presets: {known}")]
    Preset { name: String, known: String },
    #[error("unknown workload {name:?}: give one of {known} or a prompt file that exists")]
    Workload { name: String, known: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("balloon: {0}")]
    Balloon(String),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Compare(#[from] compare::CompareError),
    #[error("stopped by signal {0} while measuring the bound")]
    Interrupted(i32),
}

/// The `map_err` of an I/O step on `path`.
pub(super) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::Io { what, path, source }
}
