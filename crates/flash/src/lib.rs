//! The flash path, without llama.cpp: the flash actor owns the reader
//! (io_uring) and the expert cache, serves demand requests ("layer L needs
//! experts {..}, reply when resident"), evicts under the byte budget, and
//! counts bytes, hits and misses per requester.
//!
//! - the actor itself (this crate's root): its arena, readers, fault
//!   injection, idle-time warm reads and the read probes.
//! - [`cache`]: the expert cache's state machine and eviction policies.
//! - [`proj`]: the three projections of an expert, shared with the model layout.
//! - [`warm_profile`]: the warm-start profile, its file format and plan.
//! - [`xorshift`]: a tiny seeded generator for the probe and property tests.

pub mod cache;
pub mod proj;
pub mod warm_profile;
pub mod xorshift;

mod actor;
mod arena;
mod client;
mod config;
mod counters;
mod error;
mod fast_hits;
mod fast_pins;
mod fault;
mod idle_reads;
mod io;
mod map_budget;
mod open;
mod probe;
mod probe_fresh;
mod protocol;
mod readahead;
mod recycle;
mod residency;
mod ring;
mod shards;
mod stock;
mod uring;
mod watch;

pub use arena::{AnonBuffer, Arena, TensorSpec, N_PROJ};
pub use client::{Flash, FlashClient};
pub use config::FlashConfig;
pub use counters::{DecodeUses, FlashCounters, PrefetchCounters, TouchCounters, WarmCounters};
pub use error::{FlashError, LostMapping};
pub use fault::{
    open_faulty_reader, FaultCounts, FaultPlan, FaultReader, FaultyReader, FaultyRing, FaultySource,
};
pub use io::{PreadReader, RawSource, ReadOp, ReadStats, SliceReader};
pub use open::{open_reader, ReaderNote};
pub use probe::{probe_read_bandwidth, ProbeOrder, ProbeResult, ReadSettings};
pub use probe_fresh::probe_fresh_reads;
pub use protocol::DemandReply;
pub use recycle::SPARE_MAX_BYTES;
pub use residency::Residency;
pub use ring::{KernelRing, Ring};
pub use shards::{open_files, ShardFile, ShardedReader};
pub use uring::UringReader;
pub use watch::{FileWatch, CHECK_INTERVAL};

#[cfg(test)]
mod ring_tests;
#[cfg(test)]
mod tests;
