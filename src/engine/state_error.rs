//! Why a saved state (a prompt-cache entry in a file the user named) was
//! not read or not written.

use std::path::PathBuf;

use crate::llama::LlamaError;
use crate::prompt_cache::PromptCacheError;

/// Why a saved state was not read.
#[derive(Debug, thiserror::Error)]
pub enum StateReadError {
    #[error("{}: {source}", .file.display())]
    Stat {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is {mib} MiB, more than the {available_mib} MiB of memory available: not read",
        .file.display()
    )]
    OverMemory {
        file: PathBuf,
        mib: u64,
        available_mib: u64,
    },
    #[error(transparent)]
    Entry(#[from] PromptCacheError),
    #[error("{} holds {tokens} tokens, more than this context's {n_ctx} (-c)", .file.display())]
    TooLong {
        file: PathBuf,
        tokens: usize,
        n_ctx: u32,
    },
}

/// Why a state was not written.
#[derive(Debug, thiserror::Error)]
pub enum StateWriteError {
    #[error(
        "{} is not a bmoe prompt cache file: left as it is, no state saved",
        .0.display()
    )]
    NotAStateFile(PathBuf),
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Entry(#[from] PromptCacheError),
}
