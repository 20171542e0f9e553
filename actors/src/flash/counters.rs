//! The flash actor's counters, shared with its clients as atomics.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::Requester;

/// Counters shared (read-only outside the actor) as atomics.
#[derive(Debug, Default)]
pub struct FlashCounters {
    pub read_bytes: [AtomicU64; Requester::COUNT],
    pub hits: [AtomicU64; Requester::COUNT],
    pub misses: [AtomicU64; Requester::COUNT],
    pub evictions: AtomicU64,
    pub requests: AtomicU64,
    pub io_ns: AtomicU64,
    pub resident_bytes: AtomicU64,
    pub peak_resident_bytes: AtomicU64,
    /// Prefetched bytes that the next demand of their layer used.
    pub prefetch_useful_bytes: AtomicU64,
    /// Prefetched bytes that the next demand of their layer did not ask for
    /// (or that were evicted before it came).
    pub prefetch_wasted_bytes: AtomicU64,
    /// Prefetch hints not sent because the request channel was full.
    pub prefetch_hints_dropped: AtomicU64,
    /// Prefetch reads that failed (dropped; a demand re-reads and reports).
    pub prefetch_errors: AtomicU64,
    /// Routed experts skipped by `--drop-cold-experts` (misses only).
    pub dropped_experts: AtomicU64,
    /// Bytes read for background requests
    /// ([`FlashClient::background`](super::FlashClient::background)), also
    /// in their requester's `read_bytes`.
    pub background_read_bytes: AtomicU64,
}

impl FlashCounters {
    pub fn read_bytes_total(&self) -> u64 {
        self.read_bytes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}
