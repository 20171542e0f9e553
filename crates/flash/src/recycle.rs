//! Page recycling in the flash actor: evicted slots' pages are moved under
//! the next misses (or kept as spares, up to a cap) instead of being released
//! and faulted in again.

use std::sync::atomic::Ordering;

use super::actor::Actor;
use crate::cache::SlotKey;
use crate::proj::Proj;

const MAX_RECYCLED_SLOTS: usize = 12_000;

/// Evicted pages kept for reuse, at most this or one layer's experts, the
/// larger (they count in RSS, not in the cache).
pub const SPARE_MAX_BYTES: u64 = 32 * 1024 * 1024;

impl Actor {
    pub(super) fn evict(&mut self, keys: &[SlotKey]) {
        // No reader may hold a slot whose pages are released or moved.
        self.residency.retract_all(keys);
        self.note_evicted(keys);
        self.forget_warm(keys);
        // Keep the pages for the next misses; release what exceeds the cap.
        for k in keys {
            if !self.spares.contains(k) {
                self.spares.push_back(*k);
            }
        }
        while self.spares.len() > self.spare_cap {
            let k = self.spares.pop_front().expect("non-empty");
            for p in Proj::ALL {
                self.arena.release(k.layer, p, k.expert);
            }
        }
        self.counters
            .evictions
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.counters
            .resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
    }

    /// Give the evicted slots' pages to the misses (mremap: no faults, no
    /// zeroing) and release the rest, so RSS stays within the budget while reading.
    pub(super) fn make_room(&mut self, evict: &[SlotKey], misses: &[SlotKey]) {
        self.residency.retract_all(evict);
        // Each recycled slot can become its own memory mapping: past this many
        // resident slots, fall back to plain release to stay far below the
        // kernel's map count limit (65530 by default).
        let recycle = self.cache.resident_slots() < MAX_RECYCLED_SLOTS;
        let pairs = if recycle {
            evict.len().min(misses.len())
        } else {
            0
        };
        self.note_evicted(&evict[..pairs]);
        self.forget_warm(&evict[..pairs]);
        for (e, m) in evict.iter().zip(misses).take(pairs) {
            self.spares.retain(|s| s != e && s != m);
            self.move_pages(*e, *m);
        }
        self.counters
            .evictions
            .fetch_add(pairs as u64, Ordering::Relaxed);
        // Misses left without an evicted partner take kept pages.
        for m in &misses[pairs..] {
            if let Some(i) = self.spares.iter().position(|s| s == m) {
                // Its own old pages are still in place.
                self.spares.remove(i);
                continue;
            }
            if !recycle {
                continue;
            }
            if let Some(s) = self.spares.pop_back() {
                self.move_pages(s, *m);
            }
        }
        self.evict(&evict[pairs..]);
    }

    /// Move the pages of slot `from` (no longer cached) under slot `to` (a miss
    /// about to be read); a projection that cannot move is released instead.
    fn move_pages(&self, from: SlotKey, to: SlotKey) {
        for p in Proj::ALL {
            if !self
                .arena
                .move_slot(p, (from.layer, from.expert), (to.layer, to.expert))
            {
                self.arena.release(from.layer, p, from.expert);
            }
        }
    }
}
