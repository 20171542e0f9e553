//! Errors of the flash actor and its reader.

use std::path::PathBuf;

/// Errors of the flash actor and its reader.
#[derive(Debug, thiserror::Error)]
pub enum FlashError {
    #[error("cannot open {path} for expert reads: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path} at offset {offset} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} ends before offset {offset}: the model file was truncated or replaced while running")]
    ShortFile { path: PathBuf, offset: u64 },
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the model file {path} was {what} while running; the run stops rather than mix two \
         files' weights (restart bmoe to use the file as it is now)"
    )]
    Changed { path: PathBuf, what: String },
    #[error(
        "the io_uring queue reading {path} stopped answering ({source}) with reads in flight; \
         the run stops"
    )]
    Wedged {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}; the run stops rather than read expert slices into memory that may be another allocation's")]
    MappingLost(String),
    #[error("flash configuration: {0}")]
    Config(String),
    #[error("the flash actor has stopped: {0}")]
    Stopped(String),
    #[error("layer {layer} expert {expert} is not a streamed expert of this model")]
    UnknownExpert { layer: u32, expert: u32 },
}
