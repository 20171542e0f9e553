//! bmoe: run Mixture-of-Experts models bigger than RAM.
//!
//! Rooms: [`llama`] is the only FFI seam; [`fixture`] builds the offline test
//! models; [`layout`] says where expert bytes live; [`generate`] is plain greedy
//! generation (and its verify loop); [`draft`] is the MTP draft actor; [`inspect`] describes a model; [`lab`] is the
//! measurement harness (bench matrices against the host's bound, compare),
//! which uses the engine and which the engine never imports. What needs no
//! llama.cpp lives in three crates under `crates/`: `bmoe-flash` (the flash
//! actor and the expert cache), `bmoe-decode` (the per-token loop's pure parts
//! and the telemetry actor) and `bmoe-trace` (route traces offline).

pub mod chat;
pub mod chrome_trace;
pub(crate) mod draft;
pub mod engine;
pub mod fixture;
pub mod forecast;
pub mod generate;
pub mod inspect;
pub mod interrupt;
pub mod lab;
pub mod layout;
pub mod llama;
pub mod prompt_cache;
pub mod serve;
pub mod stdio;
pub mod stream;
pub mod user_file;

/// The engine version written into telemetry.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
