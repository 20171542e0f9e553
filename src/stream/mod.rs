//! Expert streaming, assembled: the flash actor over the model file, the
//! verify-side hook, the expert cache budget, and what happens to llama.cpp's
//! mapping (expert ranges dropped, dense ranges warmed or locked).

mod budget;
mod cache_warm;
mod config;
mod error;
mod fault;
mod files;
mod hook;
pub mod memory;
mod note;
mod predict;
pub mod route_from;
mod streamer;
mod trace;

pub use budget::AutoTerms;
pub(crate) use budget::{compute_estimate_bytes, HEADROOM_BYTES};
pub use cache_warm::{WarmSession, WarmSource};
pub use config::{resolve_cache_bytes, CacheSize, DenseMode, StreamConfig, MAX_CACHE_MB};
pub(crate) use error::StreamError;
pub use files::probe_slices;
pub(crate) use hook::{ForcedRouting, SharedAnon};
pub use note::StreamNote;
pub(crate) use streamer::hooks::DraftHookParts;
pub(crate) use streamer::Streamer;
pub use trace::header as route_trace_header;
