//! Warm start in the flash actor: the slots a profile of earlier runs names
//! are read when nothing else waits, only into free budget, at the cold end
//! of the eviction order; a demand hitting one counts it used. Single-token
//! verify demands are counted per slot for the next run's profile.

use std::sync::atomic::Ordering;

use super::actor::Actor;
use super::protocol::ALL_PROJ;
use crate::cache::SlotKey;

impl Actor {
    /// A verify demand of `experts` at `layer` hit `hits`: count the warm
    /// slots used, and a single token's routing for the profile.
    pub(super) fn note_demand_hits(&mut self, layer: u32, experts: &[u32], hits: &[SlotKey]) {
        let single = self.ahead.max_experts > 0 && experts.len() <= self.ahead.max_experts as usize;
        if single {
            self.counters.decode_uses.count(layer, experts);
        }
        self.note_warm_used(hits);
    }

    /// A verify demand hit `hits`: the warm slots among them are used.
    pub(super) fn note_warm_used(&mut self, hits: &[SlotKey]) {
        if self.warm_unused.is_empty() {
            return;
        }
        let used = hits.iter().filter(|k| self.warm_unused.remove(k)).count();
        self.counters
            .warm
            .used_slots
            .fetch_add(used as u64, Ordering::Relaxed);
    }

    /// Evicted warm slots were never used.
    pub(super) fn forget_warm(&mut self, keys: &[SlotKey]) {
        if self.warm_unused.is_empty() {
            return;
        }
        for k in keys {
            self.warm_unused.remove(k);
        }
    }

    /// Read one chunk of the warm-start plan into free budget or in place of
    /// slots demanded less often (see `ExpertCache::admit_replacing`). Slots
    /// already resident are skipped; once a slot finds no room, so is the rest.
    pub(super) fn warm_step(&mut self) {
        let c = self.counters.clone();
        let (keys, mut skipped) = self.warm_chunk();
        // Slots leave the queue's count only once their outcome is counted
        // (last, below): a reader who sees the queue empty sees every outcome.
        let mut settled = keys.len() as u64 + skipped;
        let (admitted, evicted) = self.cache.admit_replacing(&keys);
        if admitted.len() < keys.len() {
            let rest = self.warm.len() as u64;
            skipped += (keys.len() - admitted.len()) as u64 + rest;
            settled += rest;
            self.warm.clear();
        }
        c.warm.skipped_slots.fetch_add(skipped, Ordering::Relaxed);
        if !admitted.is_empty() {
            self.make_room(&evicted, &admitted);
            self.warm_read(&admitted);
        }
        c.warm.queued_slots.fetch_sub(settled, Ordering::Relaxed);
    }

    /// The next chunk of the plan not yet resident, and how many resident
    /// ones were passed over.
    fn warm_chunk(&mut self) -> (Vec<SlotKey>, u64) {
        let mut keys = Vec::with_capacity(self.ahead.chunk);
        let mut skipped = 0u64;
        while keys.len() < self.ahead.chunk {
            let Some(k) = self.warm.pop_front() else {
                break;
            };
            if self.cache.contains(k) {
                skipped += 1;
            } else {
                keys.push(k);
            }
        }
        (keys, skipped)
    }

    /// Read `admitted` (room already made) and count it.
    fn warm_read(&mut self, admitted: &[SlotKey]) {
        let c = self.counters.clone();
        let span = tracing::debug_span!("flash.warm", n = admitted.len());
        let _g = span.enter();
        match self.read_misses(admitted, &ALL_PROJ) {
            Ok(stats) => {
                c.warm
                    .read_bytes
                    .fetch_add(stats.device_bytes, Ordering::Relaxed);
                c.warm
                    .read_slots
                    .fetch_add(admitted.len() as u64, Ordering::Relaxed);
                c.resident_bytes
                    .store(self.cache.resident_bytes(), Ordering::Relaxed);
                c.peak_resident_bytes
                    .fetch_max(self.cache.peak_resident_bytes(), Ordering::Relaxed);
                self.warm_unused.extend(admitted.iter().copied());
            }
            Err(e) => {
                tracing::debug!("warm read failed (dropped, a demand will retry): {e}");
                c.prefetch.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
