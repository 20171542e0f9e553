//! The prompt cache's errors: each is a warning and a plain prefill.

use std::path::{Path, PathBuf};

/// Errors of the prompt cache: each is a warning and a plain prefill.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    #[error("prompt cache {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("prompt cache file {path} is damaged ({detail}): ignored")]
    Corrupt { path: PathBuf, detail: String },
    #[error("prompt cache file {path} was written for {detail}: ignored")]
    Mismatch { path: PathBuf, detail: String },
}

impl PromptCacheError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
