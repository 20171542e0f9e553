//! The expert cache's state machine: which (layer, expert) slices are resident,
//! their eviction order ([`CachePolicy`]), a hard byte budget and per-requester
//! pins. Pure policy: no memory, no I/O. The flash actor applies the plans it
//! returns; `bmoe replay` drives the same code from a route trace.

mod policy;
mod reuse;
mod slot_map;

use std::collections::BTreeMap;

use slot_map::SlotMap;

pub use policy::{reads_whole_layer, CachePolicy, UseCounts, AGE_PASSES};
pub use reuse::ReuseModel;
pub use slot_map::SlotKey;

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

/// Expert slots within a byte budget, evicted in the order of a
/// [`CachePolicy`]. The slots pinned by requesters are never evicted; when the
/// pinned working set alone exceeds the budget (e.g. budget 0), the cache holds
/// exactly that working set and nothing else.
#[derive(Debug)]
pub struct ExpertCache {
    budget_bytes: u64,
    policy: CachePolicy,
    counts: UseCounts,
    /// The `learned` policy's model (fed only under that policy).
    reuse: ReuseModel,
    /// Bytes of one slot, per layer.
    slot_bytes: Vec<u64>,
    /// Dense, not hashed: the eviction scan looks up every resident slot.
    entries: SlotMap<Entry>,
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
    /// An LRU cache.
    pub fn new(budget_bytes: u64, slot_bytes: Vec<u64>) -> Self {
        Self::with_policy(budget_bytes, slot_bytes, CachePolicy::Lru)
    }

    pub fn with_policy(budget_bytes: u64, slot_bytes: Vec<u64>, policy: CachePolicy) -> Self {
        Self {
            budget_bytes,
            policy,
            counts: UseCounts::default(),
            reuse: ReuseModel::default(),
            slot_bytes,
            entries: SlotMap::default(),
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

    pub fn policy(&self) -> CachePolicy {
        self.policy
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
            .map(|(k, _)| self.bytes(k))
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
        if requester != Requester::Prefetch {
            if let (Requester::Verify, Some(first)) = (requester, keys.first()) {
                self.counts.verify_layer(first.layer);
            }
            for &k in keys {
                self.counts.used(k);
            }
            if self.policy == CachePolicy::Learned {
                self.visit_layers(keys);
            }
        }
        for &k in keys {
            if self.pinned[requester.index()].contains(&k) {
                continue;
            }
            self.pinned[requester.index()].push(k);
            let bytes = self.bytes(k);
            match self.entries.get_mut(&k) {
                Some(e) => {
                    plan.hits.push(k);
                    e.pins += 1;
                }
                None => {
                    plan.misses.push(k);
                    self.entries.insert(k, Entry { tick: 0, pins: 1 });
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

    /// One visit of each layer `keys` name, for the reuse model (a demand
    /// names one layer; a request that named several visits each once).
    fn visit_layers(&mut self, keys: &[SlotKey]) {
        let Some(first) = keys.first().map(|k| k.layer) else {
            return;
        };
        if keys.iter().all(|k| k.layer == first) {
            // The usual demand: no copy on the flash thread.
            self.reuse.visit(first, keys);
            return;
        }
        let mut rest = keys.to_vec();
        while let Some(layer) = rest.first().map(|k| k.layer) {
            let (this, other): (Vec<SlotKey>, Vec<SlotKey>) =
                rest.into_iter().partition(|k| k.layer == layer);
            self.reuse.visit(layer, &this);
            rest = other;
        }
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

    /// Start the frequency-aware policies from an earlier run's routing rates
    /// (see [`UseCounts::seed`]).
    pub fn seed_counts(&mut self, passes: u32, rates: &[(SlotKey, f32)]) {
        self.counts.seed(passes, rates);
    }

    /// Keys `requester` has pinned.
    pub fn pinned(&self, requester: Requester) -> &[SlotKey] {
        &self.pinned[requester.index()]
    }

    /// Insert unpinned slots (prefetch) only where the budget has room without
    /// evicting anything; returns the ones admitted (to be read).
    pub fn admit(&mut self, keys: &[SlotKey]) -> Vec<SlotKey> {
        self.admit_with(keys, false).0
    }

    /// Insert unpinned `keys` (warm start, hottest first): into free budget,
    /// else in place of the policy's next victims when each was demanded less
    /// often than the key (use counts, seeded or counted). Stops at the first
    /// key that finds neither. Returns (admitted, evicted).
    pub fn admit_replacing(&mut self, keys: &[SlotKey]) -> (Vec<SlotKey>, Vec<SlotKey>) {
        self.admit_with(keys, true)
    }

    /// [`admit`](Self::admit), and with `replace` [`admit_replacing`](Self::admit_replacing).
    fn admit_with(&mut self, keys: &[SlotKey], replace: bool) -> (Vec<SlotKey>, Vec<SlotKey>) {
        let (mut admitted, mut evicted) = (Vec::new(), Vec::new());
        'keys: for &k in keys {
            if self.entries.contains_key(&k) {
                continue;
            }
            let b = self.bytes(k);
            while self.resident_bytes + b > self.budget_bytes {
                let victim = match replace {
                    true => self.eviction_order(b).into_iter().next(),
                    false => None,
                };
                match victim {
                    Some(v) if self.counts.uses(v) < self.counts.uses(k) => {
                        if let Some(e) = self.entries.remove(&v) {
                            self.lru.remove(&e.tick);
                            self.resident_bytes -= self.bytes(v);
                            evicted.push(v);
                        }
                    }
                    _ => break 'keys,
                }
            }
            self.entries.insert(k, Entry { tick: 0, pins: 0 });
            self.resident_bytes += b;
            self.touch(k);
            admitted.push(k);
        }
        self.peak_resident_bytes = self.peak_resident_bytes.max(self.resident_bytes);
        debug_assert!(self.accounting_holds(), "{self:?}");
        (admitted, evicted)
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
        let bytes: u64 = self.entries.iter().map(|(k, _)| self.bytes(k)).sum();
        let lru = self
            .lru
            .iter()
            .all(|(t, k)| self.entries.get(k).is_some_and(|e| e.tick == *t));
        let pins =
            self.entries.iter().all(|(k, e)| {
                e.pins as usize == self.pinned.iter().filter(|p| p.contains(&k)).count()
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
        for k in self.eviction_order(self.resident_bytes - target) {
            if self.resident_bytes <= target {
                break;
            }
            if let Some(e) = self.entries.remove(&k) {
                self.lru.remove(&e.tick);
                self.resident_bytes -= self.bytes(k);
                out.push(k);
            }
        }
        out
    }

    /// Unpinned slots in the order they go, at least enough to free
    /// `need_bytes` when there are that many: demoted ones (the latest
    /// demotion first), then the policy's order (least recently used first
    /// among equals).
    fn eviction_order(&self, need_bytes: u64) -> Vec<SlotKey> {
        let n = self.slot_bytes.len() as u32;
        // Smaller rank goes first; the tick breaks ties (least recent first).
        let rank = |k: SlotKey| match self.policy {
            CachePolicy::Lru => 0.0,
            CachePolicy::Lfu => f64::from(self.counts.uses(k)),
            CachePolicy::Cycle => -self.counts.steps_to_next_use(k, n),
            CachePolicy::Learned => {
                // Cycle's expected wait, d + n (1/q - 1), at the learned q.
                let d = f64::from(self.counts.steps_to_layer(k.layer, n));
                let own = (self.counts.use_share(k), self.counts.passes());
                let q = reuse::blended(self.reuse.chance(k), own);
                -(d + f64::from(n) * (1.0 / q - 1.0))
            }
        };
        // One walk in tick order: demoted slots (ticks below TICK_BASE, the
        // latest demotion lowest) come before every normally used one.
        let mut order = Vec::new();
        let mut ranked: Vec<(f64, u64, SlotKey)> = Vec::with_capacity(self.lru.len());
        for (&t, &k) in &self.lru {
            if self.entries.get(&k).is_none_or(|e| e.pins > 0) {
                continue;
            }
            match t < TICK_BASE {
                true => order.push(k),
                false => ranked.push((rank(k), t, k)),
            }
        }
        if self.policy == CachePolicy::Lru {
            // Already in tick order: least recently used first.
            order.extend(ranked.into_iter().map(|(_, _, k)| k));
            return order;
        }
        let cmp = |a: &(f64, u64, SlotKey), b: &(f64, u64, SlotKey)| {
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
        };
        // Only the first few are needed: select them, then order those.
        let smallest = self
            .slot_bytes
            .iter()
            .copied()
            .filter(|&b| b > 0)
            .min()
            .unwrap_or(1);
        let want = (need_bytes.div_ceil(smallest) as usize).clamp(1, ranked.len().max(1));
        if want < ranked.len() {
            ranked.select_nth_unstable_by(want - 1, cmp);
            ranked.truncate(want);
        }
        ranked.sort_unstable_by(cmp);
        order.extend(ranked.into_iter().map(|(_, _, k)| k));
        order
    }
}

#[cfg(test)]
mod tests;
