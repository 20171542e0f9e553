//! The prompt cache (`bmoe serve --prompt-cache`, `bmoe run --prompt-cache-file`):
//! the KV state of recent prompts, keyed by their tokens, kept in RAM within a
//! byte budget and on disk under a directory with a size cap (least recently
//! used first out), so a prompt that starts with a cached prefix restores it
//! and prefills only the rest, also after a restart.
//!
//! Pure Rust without FFI: the state bytes come from and go to llama.cpp
//! through `llama::Context::seq_state`. Every entry names what made it
//! ([`Ident`]: model file, KV streams, settings, bmoe version; the context
//! size too, which restores wherever its tokens fit) and carries a
//! CRC-32 of its bytes; a mismatch or a damaged file is a warning and a miss,
//! never a restore. Files are written beside their place and renamed into it
//! (two processes may share a directory), by a background writer with a
//! bounded queue so that a write never holds up a reply.

//!
//! This file is the room's face: the files of the room import each other by
//! path, never through it.

mod cache;
mod disk;
mod entry;
mod error;
mod experts;
mod hit;
mod ident;
mod model_id;
mod owned;
mod ram;
mod writer;

pub use cache::{Config, PromptCache};
pub use disk::dir_bytes;
pub use entry::{is_cache_file, read_any_entry, read_entry, write_entry, Entry};
pub use error::PromptCacheError;
pub use experts::ExpertSet;
pub use hit::{common_prefix, Hit, Stats};
pub use ident::Ident;
pub use model_id::model_id;
