//! Page recycling in the flash actor: evicted slots' pages are moved under
//! the next misses (or kept as spares, up to a cap) instead of being released
//! and faulted in again.
//!
//! Spares are kept per projection, and a miss takes pages of its own size:
//! a quant mix gives one projection different sizes in different layers
//! (Q4_K_M's `ffn_down` is Q6_K in some layers and Q4_K in the others), so
//! pages of one evicted slot may fit one projection of a miss and not another.

use std::sync::atomic::Ordering;

use super::actor::Actor;
use crate::cache::SlotKey;
use crate::proj::Proj;

const MAX_RECYCLED_SLOTS: usize = 12_000;

/// Evicted pages kept for reuse, at most this or one layer's experts, the
/// larger (they count in RSS, not in the cache).
pub const SPARE_MAX_BYTES: u64 = 32 * 1024 * 1024;

impl Actor {
    /// Slots the cache has evicted: no reader may hold them any more; their
    /// pages are kept as spares (the oldest released past the cap).
    pub(super) fn evict(&mut self, keys: &[SlotKey]) {
        self.let_go(keys);
        self.trim_spares();
    }

    /// Give the evicted slots' pages to the misses (mremap: no faults, no
    /// zeroing) and release what exceeds the cap, so RSS stays within the
    /// budget while reading.
    pub(super) fn make_room(&mut self, evict: &[SlotKey], misses: &[SlotKey]) {
        self.let_go(evict);
        // Each recycled slot can become its own memory mapping: past this many
        // resident slots, fall back to plain release to stay far below the
        // kernel's map count limit (65530 by default).
        if self.cache.resident_slots() < MAX_RECYCLED_SLOTS {
            for &m in misses {
                for p in Proj::ALL {
                    self.give_pages(p, m);
                }
            }
        }
        self.trim_spares();
        self.set_stock_room();
    }

    /// Tell the toucher how much the cache may still grow by.
    pub(super) fn set_stock_room(&self) {
        if let Some(stock) = &self.pages.stock {
            let c = &self.cache;
            stock.set_room(c.budget_bytes().saturating_sub(c.resident_bytes()));
        }
    }

    /// Retract, judge and count evicted `keys`, and keep their pages as the
    /// newest spares of every projection.
    fn let_go(&mut self, keys: &[SlotKey]) {
        self.residency.retract_all(keys);
        self.note_evicted(keys);
        self.forget_warm(keys);
        for spares in &mut self.pages.spares {
            for k in keys {
                if !spares.contains(k) {
                    spares.push_back(*k);
                }
            }
        }
        self.counters
            .evictions
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.counters
            .resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
    }

    /// Pages for projection `p` of miss `m`: its own, still in place, the
    /// newest spare's of the same size (moved), or a cell the toucher backed.
    fn give_pages(&mut self, p: Proj, m: SlotKey) {
        let spares = &mut self.pages.spares[p.index()];
        if let Some(i) = spares.iter().position(|s| *s == m) {
            spares.remove(i);
            return;
        }
        let len = |k: &SlotKey| self.arena.slot(k.layer, p, k.expert).map(|s| s.2);
        let want = len(&m);
        let Some(i) = spares.iter().rposition(|s| len(s) == want) else {
            self.give_touched(p, m);
            return;
        };
        let s = spares.remove(i).expect("a position inside the list");
        if !self
            .arena
            .move_slot(p, (s.layer, s.expert), (m.layer, m.expert))
        {
            self.arena.release(s.layer, p, s.expert);
        }
    }

    /// A ready cell's pages under projection `p` of miss `m`, when the
    /// toucher has one (a slot never used before would fault each page in).
    fn give_touched(&mut self, p: Proj, m: SlotKey) {
        let Some(stock) = &self.pages.stock else {
            return;
        };
        // Past the mapping budget the cell stays ready.
        let admitted = self.arena.may_move_into(p, (m.layer, m.expert));
        let cell = admitted.then(|| stock.ready()).flatten();
        let Some(cell) = cell else {
            if stock.has_room() {
                self.counters
                    .touch
                    .touch_misses
                    .fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        // The cell is the actor's until `taken` (the ring's protocol), page
        // aligned in the stock's own private anonymous region.
        // SAFETY: as the comment above says.
        let moved = unsafe {
            self.arena
                .move_in(p, (m.layer, m.expert), cell.addr, cell.bytes)
        };
        stock.taken(moved);
        self.counters
            .touch
            .touched_bytes
            .fetch_add(moved as u64, Ordering::Relaxed);
    }

    /// Release the oldest spares of each projection past the cap.
    fn trim_spares(&mut self) {
        for p in Proj::ALL {
            while self.pages.spares[p.index()].len() > self.pages.spare_cap {
                let k = self.pages.spares[p.index()].pop_front().expect("non-empty");
                self.arena.release(k.layer, p, k.expert);
            }
        }
    }
}
