//! Errors of the flash actor and its reader.

use std::path::PathBuf;

use crate::proj::Proj;

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
    MappingLost(LostMapping),
    #[error("flash configuration: no slices to probe")]
    NoSlices,
    #[error("flash configuration: cannot allocate a {bytes}-byte {what}")]
    Alloc { what: &'static str, bytes: u64 },
    #[error("flash configuration: shard bases must be given in increasing order")]
    ShardOrder,
    #[error("flash configuration: the io_uring submission queue takes no reads")]
    RingTakesNoReads,
    #[error("the flash actor has stopped: request channel closed")]
    RequestsClosed,
    #[error("the flash actor has stopped: no reply")]
    NoReply,
    #[error("layer {layer} expert {expert} is not a streamed expert of this model")]
    UnknownExpert { layer: u32, expert: u32 },
}

/// A refused page move that left a slot's memory unmapped and could not map
/// it again: every later read into the arena fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a refused page move ({cause}) left {bytes} bytes of layer {layer} {} expert {expert}'s \
     memory unmapped at {addr:#x}, and they could not be mapped again",
    .proj.name()
)]
pub struct LostMapping {
    pub layer: u32,
    pub proj: Proj,
    pub expert: u32,
    pub bytes: usize,
    pub addr: usize,
    /// The move's error, as the OS said it.
    pub cause: String,
}
