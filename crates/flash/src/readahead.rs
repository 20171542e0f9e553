//! The flash actor's idle-time reads: temporal and predictive prefetch
//! (queued, judged useful or wasted by the next demand of their layer) and
//! background reads for a requester.

use std::sync::atomic::Ordering;

use super::actor::Actor;
use super::io::ReadStats;
use super::protocol::ALL_PROJ;
use crate::cache::{Requester, SlotKey};

impl Actor {
    /// Read one chunk of background work, for the requester at its head.
    pub(super) fn background_step(&mut self) {
        let Some(&(owner, _)) = self.background.front() else {
            return;
        };
        let mut keys = Vec::with_capacity(self.ahead.chunk);
        while keys.len() < self.ahead.chunk {
            match self.background.front() {
                Some(&(r, k)) if r == owner => {
                    self.background.pop_front();
                    keys.push(k);
                }
                _ => break,
            }
        }
        let span = tracing::debug_span!(
            "flash.background",
            requester = owner.name(),
            layer = keys[0].layer,
            n = keys.len()
        );
        let _g = span.enter();
        // Pinned as the owner's (hits too), so they stay until its next demand.
        let plan = self.cache.request_more(owner, &keys);
        self.make_room(&plan.evict, &plan.misses);
        match self.read_misses(&plan.misses, &ALL_PROJ) {
            Ok(stats) => {
                self.count_idle_read(owner, &stats);
                self.counters
                    .background_read_bytes
                    .fetch_add(stats.device_bytes, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!("background read failed (dropped, a demand will retry): {e}");
                self.counters
                    .prefetch
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn n_layer(&self) -> u32 {
        self.ahead.history.len() as u32
    }

    /// Layers a prefetch may still help once `layer` has been demanded.
    fn in_window(&self, layer: u32, candidate: u32) -> bool {
        let n = self.n_layer().max(1);
        let ahead = (candidate + n - layer % n) % n;
        ahead >= 1 && ahead <= self.ahead.layers.max(1)
    }

    /// A verify demand of `layer` arrived: judge what was prefetched for it,
    /// drop stale queued work, queue the next layers' history.
    pub(super) fn after_verify_demand(&mut self, layer: u32, experts: &[u32]) {
        let judged: Vec<SlotKey> = self
            .ahead
            .prefetched
            .keys()
            .filter(|k| k.layer == layer)
            .copied()
            .collect();
        let mut unused = Vec::new();
        for k in judged {
            let bytes = self.ahead.prefetched.remove(&k).unwrap_or(0);
            let c = if experts.contains(&k.expert) {
                &self.counters.prefetch.useful_bytes
            } else {
                unused.push(k);
                &self.counters.prefetch.wasted_bytes
            };
            c.fetch_add(bytes, Ordering::Relaxed);
        }
        // A wrong guess must not push useful slots out of the cache.
        self.cache.demote(&unused);
        let evicted = self.cache.release_layer(Requester::Prefetch, layer);
        self.evict(&evicted);
        if self.ahead.max_experts == 0 || experts.len() <= self.ahead.max_experts as usize {
            if let Some(h) = self.ahead.history.get_mut(layer as usize) {
                h.clear();
                h.extend_from_slice(experts);
            }
        }
        let queue = std::mem::take(&mut self.ahead.queue);
        self.ahead.queue = queue
            .into_iter()
            .filter(|k| self.in_window(layer, k.layer))
            .collect();
        let n = self.n_layer();
        for d in 1..=self.ahead.layers {
            let l = (layer + d) % n.max(1);
            for i in 0..self.ahead.history[l as usize].len() {
                let k = SlotKey {
                    layer: l,
                    expert: self.ahead.history[l as usize][i],
                };
                if !self.cache.contains(k) && !self.ahead.queue.contains(&k) {
                    self.ahead.queue.push_back(k);
                }
            }
        }
    }

    /// Read one chunk of queued prefetch work.
    pub(super) fn prefetch_step(&mut self) {
        let mut keys = Vec::with_capacity(self.ahead.chunk);
        while keys.len() < self.ahead.chunk {
            let Some(k) = self.ahead.queue.pop_front() else {
                break;
            };
            if !self.cache.contains(k) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return;
        }
        let span = tracing::debug_span!("flash.prefetch", layer = keys[0].layer, n = keys.len());
        let _g = span.enter();
        let plan = self.cache.request_more(Requester::Prefetch, &keys);
        self.make_room(&plan.evict, &plan.misses);
        match self.read_misses(&plan.misses, &ALL_PROJ) {
            Ok(stats) => {
                self.count_idle_read(Requester::Prefetch, &stats);
                for k in &plan.misses {
                    let b = self.slot_bytes.get(k.layer as usize).copied().unwrap_or(0);
                    self.ahead.prefetched.insert(*k, b);
                }
            }
            Err(e) => {
                tracing::debug!("prefetch read failed (dropped, a demand will retry): {e}");
                self.counters
                    .prefetch
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Count a read done on idle time (prefetch or background) for `requester`.
    fn count_idle_read(&self, requester: Requester, stats: &ReadStats) {
        let c = &self.counters;
        c.read_bytes[requester.index()].fetch_add(stats.device_bytes, Ordering::Relaxed);
        c.io_ns
            .fetch_add(stats.elapsed.as_nanos() as u64, Ordering::Relaxed);
        c.resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
        c.peak_resident_bytes
            .fetch_max(self.cache.peak_resident_bytes(), Ordering::Relaxed);
    }

    /// Prefetched slots that leave the cache before their demand are wasted.
    pub(super) fn note_evicted(&mut self, keys: &[SlotKey]) {
        if self.ahead.prefetched.is_empty() {
            return;
        }
        for k in keys {
            if let Some(b) = self.ahead.prefetched.remove(k) {
                self.counters
                    .prefetch
                    .wasted_bytes
                    .fetch_add(b, Ordering::Relaxed);
            }
        }
    }
}
