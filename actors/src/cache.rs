//! The expert cache's state machine: which (layer, expert) slices are resident,
//! LRU order, a hard byte budget and per-requester pins. Pure policy: no memory,
//! no I/O. The flash actor applies the plans it returns.

use std::collections::{BTreeMap, HashMap};

/// One cached unit: all projections of one expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    pub layer: u32,
    pub expert: u32,
}

/// Who asks for experts; each has its own pins and byte counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Requester {
    Verify = 0,
    Draft = 1,
    Prefetch = 2,
}

impl Requester {
    pub const COUNT: usize = 3;
    pub const ALL: [Requester; 3] = [Requester::Verify, Requester::Draft, Requester::Prefetch];
    pub fn index(self) -> usize {
        self as usize
    }
    pub fn name(self) -> &'static str {
        match self {
            Requester::Verify => "verify",
            Requester::Draft => "draft",
            Requester::Prefetch => "prefetch",
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    tick: u64,
    pins: u32,
}

/// What the flash actor must do to serve a request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Requested and already resident.
    pub hits: Vec<SlotKey>,
    /// Requested and absent: read them before replying (now accounted resident).
    pub misses: Vec<SlotKey>,
    /// Release these before reading (LRU, unpinned).
    pub evict: Vec<SlotKey>,
}

/// LRU over expert slots with a byte budget. The slots pinned by requesters are
/// never evicted; when the pinned working set alone exceeds the budget (e.g.
/// budget 0), the cache holds exactly that working set and nothing else.
#[derive(Debug)]
pub struct ExpertCache {
    budget_bytes: u64,
    /// Bytes of one slot, per layer.
    slot_bytes: Vec<u64>,
    entries: HashMap<SlotKey, Entry>,
    lru: BTreeMap<u64, SlotKey>,
    pinned: [Vec<SlotKey>; Requester::COUNT],
    resident_bytes: u64,
    peak_resident_bytes: u64,
    tick: u64,
    /// Ticks handed to demoted slots count down from below the first normal
    /// tick, so demoted slots are always the least recently used.
    cold_tick: u64,
}

/// First LRU tick of a normally used slot (demoted ones sit below it).
const TICK_BASE: u64 = 1 << 40;

impl ExpertCache {
    pub fn new(budget_bytes: u64, slot_bytes: Vec<u64>) -> Self {
        Self {
            budget_bytes,
            slot_bytes,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            pinned: Default::default(),
            resident_bytes: 0,
            peak_resident_bytes: 0,
            tick: TICK_BASE,
            cold_tick: TICK_BASE - 1,
        }
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    pub fn peak_resident_bytes(&self) -> u64 {
        self.peak_resident_bytes
    }

    pub fn resident_slots(&self) -> usize {
        self.entries.len()
    }

    pub fn contains(&self, key: SlotKey) -> bool {
        self.entries.contains_key(&key)
    }

    fn bytes(&self, key: SlotKey) -> u64 {
        self.slot_bytes
            .get(key.layer as usize)
            .copied()
            .unwrap_or(0)
    }

    fn pinned_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|(_, e)| e.pins > 0)
            .map(|(k, _)| self.bytes(*k))
            .sum()
    }

    /// The most bytes the cache may hold right now: the budget, or the pinned
    /// working set when that alone is larger.
    pub fn limit_bytes(&self) -> u64 {
        self.budget_bytes.max(self.pinned_bytes())
    }

    fn touch(&mut self, key: SlotKey) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.lru.remove(&e.tick);
            e.tick = self.tick;
            self.lru.insert(self.tick, key);
        }
    }

    /// `requester` now needs `keys` (its previous pins are released): returns the
    /// hits, the misses to read, and the evictions that keep the cache within budget.
    pub fn request(&mut self, requester: Requester, keys: &[SlotKey]) -> Plan {
        let old = std::mem::take(&mut self.pinned[requester.index()]);
        self.unpin(&old);
        self.request_more(requester, keys)
    }

    /// `requester` also needs `keys`, keeping its earlier pins (prefetch over a
    /// window of layers). Same plan as [`request`](Self::request).
    pub fn request_more(&mut self, requester: Requester, keys: &[SlotKey]) -> Plan {
        let mut plan = Plan::default();
        for &k in keys {
            if self.pinned[requester.index()].contains(&k) {
                continue;
            }
            self.pinned[requester.index()].push(k);
            let bytes = self.bytes(k);
            match self.entries.entry(k) {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    plan.hits.push(k);
                    e.get_mut().pins += 1;
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    plan.misses.push(k);
                    v.insert(Entry { tick: 0, pins: 1 });
                    self.resident_bytes += bytes;
                }
            }
            self.touch(k);
        }
        plan.evict = self.evict_to(self.budget_bytes);
        self.peak_resident_bytes = self.peak_resident_bytes.max(self.resident_bytes);
        debug_assert!(self.accounting_holds(), "{self:?}");
        plan
    }

    /// Release `requester`'s pins on `layer` only; returns the evictions that
    /// bring the cache back within budget.
    pub fn release_layer(&mut self, requester: Requester, layer: u32) -> Vec<SlotKey> {
        let pins = &mut self.pinned[requester.index()];
        let (gone, kept): (Vec<SlotKey>, Vec<SlotKey>) =
            pins.iter().partition(|k| k.layer == layer);
        *pins = kept;
        self.unpin_and_evict(&gone)
    }

    /// Move resident `keys` to the cold end of the LRU (evicted first), e.g.
    /// prefetched slots their layer's demand did not use.
    pub fn demote(&mut self, keys: &[SlotKey]) {
        for k in keys {
            if let Some(e) = self.entries.get_mut(k) {
                self.lru.remove(&e.tick);
                self.cold_tick -= 1;
                e.tick = self.cold_tick;
                self.lru.insert(self.cold_tick, *k);
            }
        }
    }

    /// Keys `requester` has pinned.
    pub fn pinned(&self, requester: Requester) -> &[SlotKey] {
        &self.pinned[requester.index()]
    }

    /// Insert unpinned slots (prefetch) only where the budget has room without
    /// evicting anything; returns the ones admitted (to be read).
    pub fn admit(&mut self, keys: &[SlotKey]) -> Vec<SlotKey> {
        let mut admitted = Vec::new();
        for &k in keys {
            if self.entries.contains_key(&k) {
                continue;
            }
            let b = self.bytes(k);
            if self.resident_bytes + b > self.budget_bytes {
                break;
            }
            self.entries.insert(k, Entry { tick: 0, pins: 0 });
            self.resident_bytes += b;
            self.touch(k);
            admitted.push(k);
        }
        self.peak_resident_bytes = self.peak_resident_bytes.max(self.resident_bytes);
        debug_assert!(self.accounting_holds(), "{self:?}");
        admitted
    }

    /// Drop slots that could not be loaded (a failed read): they are not resident.
    pub fn forget(&mut self, keys: &[SlotKey]) {
        for k in keys {
            if let Some(e) = self.entries.remove(k) {
                self.lru.remove(&e.tick);
                self.resident_bytes -= self.bytes(*k);
            }
            for pins in self.pinned.iter_mut() {
                pins.retain(|p| p != k);
            }
        }
        debug_assert!(self.accounting_holds(), "{self:?}");
    }

    /// A new byte budget; returns the evictions that bring the cache within it
    /// (pinned slots stay, as always).
    pub fn set_budget(&mut self, bytes: u64) -> Vec<SlotKey> {
        self.budget_bytes = bytes;
        let evicted = self.evict_to(bytes);
        debug_assert!(self.accounting_holds(), "{self:?}");
        evicted
    }

    /// Release all pins of `requester` (e.g. at the end of a decode).
    pub fn release(&mut self, requester: Requester) -> Vec<SlotKey> {
        let old = std::mem::take(&mut self.pinned[requester.index()]);
        self.unpin_and_evict(&old)
    }

    /// Drop one pin from each of `keys` (already taken out of a requester's list).
    fn unpin(&mut self, keys: &[SlotKey]) {
        for k in keys {
            if let Some(e) = self.entries.get_mut(k) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// [`unpin`](Self::unpin), then the evictions that bring the cache back within budget.
    fn unpin_and_evict(&mut self, keys: &[SlotKey]) -> Vec<SlotKey> {
        self.unpin(keys);
        let evicted = self.evict_to(self.budget_bytes);
        debug_assert!(self.accounting_holds(), "{self:?}");
        evicted
    }

    /// The accounting the tests check from outside, for `debug_assert!` after
    /// every mutation: the resident bytes are the entries' bytes, the LRU
    /// orders exactly the entries, every pin is a resident slot counted once per
    /// requester that holds it, and the cache holds at most its limit.
    fn accounting_holds(&self) -> bool {
        if self.lru.len() != self.entries.len() {
            return false;
        }
        // The walk over every slot runs on small caches (the tests') always,
        // on big ones at one LRU tick in 64, so a debug build streaming a big
        // cache stays within a fraction of a millisecond per token.
        if self.entries.len() > 64 && self.tick % 64 != 0 {
            return true;
        }
        let bytes: u64 = self.entries.keys().map(|k| self.bytes(*k)).sum();
        let lru = self
            .lru
            .iter()
            .all(|(t, k)| self.entries.get(k).is_some_and(|e| e.tick == *t));
        let pins =
            self.entries.iter().all(|(k, e)| {
                e.pins as usize == self.pinned.iter().filter(|p| p.contains(k)).count()
            }) && self
                .pinned
                .iter()
                .flatten()
                .all(|k| self.entries.contains_key(k));
        bytes == self.resident_bytes && lru && pins && self.resident_bytes <= self.limit_bytes()
    }

    fn evict_to(&mut self, target: u64) -> Vec<SlotKey> {
        let mut out = Vec::new();
        if self.resident_bytes <= target {
            return out;
        }
        let candidates: Vec<(u64, SlotKey)> = self.lru.iter().map(|(t, k)| (*t, *k)).collect();
        for (t, k) in candidates {
            if self.resident_bytes <= target {
                break;
            }
            if self.entries.get(&k).is_some_and(|e| e.pins == 0) {
                self.entries.remove(&k);
                self.lru.remove(&t);
                self.resident_bytes -= self.bytes(k);
                out.push(k);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(layer: u32, expert: u32) -> SlotKey {
        SlotKey { layer, expert }
    }

    #[test]
    fn hits_misses_and_lru_eviction_under_budget() {
        let mut c = ExpertCache::new(300, vec![100; 4]);
        let p = c.request(Requester::Verify, &[k(0, 1), k(0, 2)]);
        assert_eq!(p.misses, vec![k(0, 1), k(0, 2)]);
        assert!(p.hits.is_empty() && p.evict.is_empty());
        let p = c.request(Requester::Verify, &[k(1, 1), k(1, 2)]);
        assert_eq!(p.misses.len(), 2);
        // 400 > 300: the least recently used unpinned slot goes.
        assert_eq!(p.evict, vec![k(0, 1)]);
        assert_eq!(c.resident_bytes(), 300);
        let p = c.request(Requester::Verify, &[k(0, 2), k(1, 2)]);
        assert_eq!(p.hits, vec![k(0, 2), k(1, 2)]);
        assert!(p.misses.is_empty());
    }

    #[test]
    fn a_smaller_budget_evicts_the_unpinned_down_to_it() {
        let mut c = ExpertCache::new(400, vec![100; 4]);
        c.request(Requester::Verify, &[k(0, 1), k(0, 2), k(1, 1)]);
        c.release(Requester::Verify);
        c.request(Requester::Verify, &[k(1, 1)]);
        let evicted = c.set_budget(150);
        assert_eq!(
            evicted,
            vec![k(0, 1), k(0, 2)],
            "LRU order, the pinned slot stays"
        );
        assert_eq!(c.budget_bytes(), 150);
        assert_eq!(c.resident_bytes(), 100);
        assert!(c.set_budget(1000).is_empty());
    }

    #[test]
    fn budget_zero_keeps_only_the_working_set() {
        let mut c = ExpertCache::new(0, vec![100; 2]);
        c.request(Requester::Verify, &[k(0, 0), k(0, 1)]);
        assert_eq!(c.resident_bytes(), 200, "pinned working set stays");
        let p = c.request(Requester::Verify, &[k(1, 0), k(1, 1)]);
        assert_eq!(p.evict.len(), 2);
        assert_eq!(c.resident_bytes(), 200);
        let p = c.request(Requester::Verify, &[k(0, 0), k(0, 1)]);
        assert_eq!(p.misses.len(), 2, "re-read every time");
        assert_eq!(c.release(Requester::Verify).len(), 2);
        assert_eq!(c.resident_bytes(), 0);
    }

    #[test]
    fn another_requesters_pins_are_respected() {
        let mut c = ExpertCache::new(100, vec![100; 2]);
        c.request(Requester::Draft, &[k(1, 0)]);
        let p = c.request(Requester::Verify, &[k(0, 0)]);
        assert!(p.evict.is_empty(), "both pinned");
        assert_eq!(c.resident_bytes(), 200);
        let p = c.request(Requester::Draft, &[k(1, 1)]);
        assert_eq!(p.evict, vec![k(1, 0)]);
        assert!(c.contains(k(0, 0)));
    }

    #[test]
    fn duplicates_in_a_request_count_once() {
        let mut c = ExpertCache::new(1000, vec![100]);
        let p = c.request(Requester::Verify, &[k(0, 3), k(0, 3), k(0, 3)]);
        assert_eq!(p.misses, vec![k(0, 3)]);
        assert_eq!(c.resident_bytes(), 100);
    }

    #[test]
    fn prefetch_pins_accumulate_and_release_per_layer() {
        let mut c = ExpertCache::new(0, vec![100; 3]);
        c.request_more(Requester::Prefetch, &[k(1, 0)]);
        c.request_more(Requester::Prefetch, &[k(2, 0), k(2, 1)]);
        assert_eq!(c.resident_bytes(), 300, "pins of both layers kept");
        // The verify demand for layer 1 hits the prefetched slot.
        let p = c.request(Requester::Verify, &[k(1, 0), k(1, 1)]);
        assert_eq!(p.hits, vec![k(1, 0)]);
        assert_eq!(p.misses, vec![k(1, 1)]);
        // Unpinning layer 1's prefetch keeps it (verify pins it), layer 2 stays pinned.
        assert!(c.release_layer(Requester::Prefetch, 1).is_empty());
        let p = c.request(Requester::Verify, &[k(2, 1)]);
        assert_eq!(p.hits, vec![k(2, 1)]);
        assert_eq!(p.evict.len(), 2, "layer 1 unpinned by everyone, budget 0");
        assert_eq!(c.release_layer(Requester::Prefetch, 2), vec![k(2, 0)]);
        assert!(c.contains(k(2, 1)));
    }

    #[test]
    fn demoted_slots_are_evicted_first() {
        let mut c = ExpertCache::new(300, vec![100; 2]);
        c.request(Requester::Verify, &[k(0, 0), k(0, 1), k(0, 2)]);
        c.release(Requester::Verify);
        // k(0, 2) is the most recent; demoting it makes it the first to go.
        c.demote(&[k(0, 2)]);
        let p = c.request(Requester::Verify, &[k(1, 0)]);
        assert_eq!(p.evict, vec![k(0, 2)]);
        let p = c.request(Requester::Verify, &[k(1, 1)]);
        assert_eq!(p.evict, vec![k(0, 0)], "then plain LRU order");
    }

    #[test]
    fn admit_never_evicts() {
        let mut c = ExpertCache::new(250, vec![100; 3]);
        c.request(Requester::Verify, &[k(0, 0)]);
        let a = c.admit(&[k(1, 0), k(2, 0)]);
        assert_eq!(a, vec![k(1, 0)]);
        assert_eq!(c.resident_bytes(), 200);
    }

    /// Property: over random request sequences, resident bytes never exceed
    /// max(budget, pinned working set), and accounting matches the entries.
    #[test]
    fn never_exceeds_budget_over_random_sequences() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for trial in 0..50 {
            let layers = 1 + (next() % 6) as u32;
            let experts = 1 + (next() % 16) as u32;
            let sizes: Vec<u64> = (0..layers).map(|_| 1 + next() % 500).collect();
            let budget = next() % 3000;
            let mut c = ExpertCache::new(budget, sizes.clone());
            for _ in 0..400 {
                let who = Requester::ALL[(next() % 3) as usize];
                let layer = (next() % layers as u64) as u32;
                let n = (next() % 5) as usize;
                let keys: Vec<SlotKey> = (0..n)
                    .map(|_| k(layer, (next() % experts as u64) as u32))
                    .collect();
                if next() % 10 == 0 {
                    c.admit(&keys);
                } else if next() % 17 == 0 {
                    c.release(who);
                } else if next() % 11 == 0 {
                    c.demote(&keys);
                } else if next() % 7 == 0 {
                    let evicted = c.release_layer(who, layer);
                    assert!(c.pinned(who).iter().all(|p| p.layer != layer));
                    for e in &evicted {
                        assert!(!c.contains(*e));
                    }
                } else if next() % 5 == 0 {
                    let p = c.request_more(who, &keys);
                    for e in &p.evict {
                        assert!(!c.contains(*e));
                        assert!(!c.pinned(who).contains(e), "never evict a pinned slot");
                    }
                    for key in &keys {
                        assert!(c.contains(*key));
                    }
                } else {
                    let p = c.request(who, &keys);
                    for m in &p.misses {
                        assert!(c.contains(*m));
                    }
                    for e in &p.evict {
                        assert!(!c.contains(*e));
                        assert!(!keys.contains(e), "never evict what was just asked for");
                    }
                }
                let sum: u64 = c.entries.keys().map(|k| sizes[k.layer as usize]).sum();
                assert_eq!(sum, c.resident_bytes(), "trial {trial}");
                assert!(
                    c.resident_bytes() <= c.limit_bytes(),
                    "trial {trial}: over budget"
                );
            }
        }
    }
}
