//! The flash actor's counters, shared with its clients as atomics.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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
    /// Routed experts skipped by `--drop-cold-experts` (misses only).
    pub dropped_experts: AtomicU64,
    /// Bytes read for background requests
    /// ([`FlashClient::background`](super::client::FlashClient::background)), also
    /// in their requester's `read_bytes`.
    pub background_read_bytes: AtomicU64,
    pub touch: TouchCounters,
    pub prefetch: PrefetchCounters,
    pub warm: WarmCounters,
    pub decode_uses: DecodeUses,
}

/// Where the pages of misses' slots came from.
#[derive(Debug, Default)]
pub struct TouchCounters {
    /// Page faults the flash thread took in its reads (a read landing on
    /// pages no evicted slot gave it: each one allocated and zeroed).
    pub read_faults: AtomicU64,
    /// Bytes of misses' slots given pages the toucher backed ahead, and
    /// projections of misses that found no ready cell while the cache had
    /// room to grow (each faulted its pages in).
    pub touched_bytes: AtomicU64,
    pub touch_misses: AtomicU64,
    /// Bytes the toucher has backed ahead (cells filled, refills included).
    pub pretouched_bytes: AtomicU64,
}

/// What the prefetcher's reads came to.
#[derive(Debug, Default)]
pub struct PrefetchCounters {
    /// Prefetched bytes that the next demand of their layer used.
    pub useful_bytes: AtomicU64,
    /// Prefetched bytes that the next demand of their layer did not ask for
    /// (or that were evicted before it came).
    pub wasted_bytes: AtomicU64,
    /// Prefetch hints not sent because the request channel was full.
    pub hints_dropped: AtomicU64,
    /// Prefetch reads that failed (dropped; a demand re-reads and reports).
    pub errors: AtomicU64,
}

/// Warm start ([`Flash::warm`](super::client::Flash::warm)): slots read, their
/// bytes, those a demand then hit (used), those planned but resident or
/// without room (skipped), and those still queued.
#[derive(Debug, Default)]
pub struct WarmCounters {
    pub read_slots: AtomicU64,
    pub read_bytes: AtomicU64,
    pub used_slots: AtomicU64,
    pub skipped_slots: AtomicU64,
    pub queued_slots: AtomicU64,
}

/// Per (layer, expert), layer-major with [`stride`](Self::stride): how many
/// single-token verify demands routed to it (the warm-start profile).
#[derive(Debug, Default)]
pub struct DecodeUses {
    cells: Vec<AtomicU32>,
    /// Experts per layer.
    pub stride: usize,
}

impl DecodeUses {
    /// A cell per (layer, expert).
    fn new(n_layer: usize, n_expert: usize) -> Self {
        Self {
            cells: (0..n_layer * n_expert).map(|_| AtomicU32::new(0)).collect(),
            stride: n_expert,
        }
    }

    /// Count one single-token demand of `experts` at `layer`.
    pub fn count(&self, layer: u32, experts: &[u32]) {
        for &e in experts {
            let i = layer as usize * self.stride + e as usize;
            if let Some(c) = self.cells.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counts as plain numbers.
    pub fn snapshot(&self) -> Vec<u32> {
        self.cells
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

impl FlashCounters {
    /// Counters with a [`decode_uses`](Self::decode_uses) cell per slot.
    pub fn with_slots(n_layer: usize, n_expert: usize) -> Self {
        Self {
            decode_uses: DecodeUses::new(n_layer, n_expert),
            ..Self::default()
        }
    }

    /// Every byte read: each requester's and warm start's.
    pub fn read_bytes_total(&self) -> u64 {
        self.read_bytes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.warm.read_bytes.load(Ordering::Relaxed)
    }
}
