//! A route trace replayed through the expert cache ([`replay`]) and through the
//! offline optimum ([`belady`]): hit rate and bytes read per token for a budget
//! and a policy, in milliseconds instead of a rerun of the model.
//!
//! The replay makes the verify requester's demands in the trace's order with
//! the cache's own code, so with no prefetch or lossy drop it reproduces the
//! live run's hits exactly at the same fixed budget. A prompt's read-ahead of
//! the next layer (a wide batch) is replayed as if every read finished before
//! its layer's demand; live, some may not have, so a replay of a long prompt
//! may count a few more hits than the run. `--prefetch`, `--predict-prefetch`,
//! `--cache-mb auto`'s resizing and the MTP head's demands are not in the trace.

use std::collections::{BTreeSet, HashMap};

use crate::route_trace::{TraceHeader, TraceRecord};
use bmoe_flash::cache::{reads_whole_layer, CachePolicy, ExpertCache, Requester, SlotKey};

/// One layer's demand: the distinct experts its batch routed to, and whether
/// it belongs to a prompt decode.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub keys: Vec<SlotKey>,
    /// Routed ids of every row (rows x k).
    pub routed_ids: usize,
    pub prompt: bool,
}

/// A trace as the cache sees it.
#[derive(Debug, Clone, Default)]
pub struct Demands {
    pub demands: Vec<Demand>,
    /// Tokens processed by prompt decodes and by the others (generation).
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub decodes: u64,
}

/// Each layer's union, per decode; a decode with rows whose logits were not
/// computed is a prompt's (a verify decode computes every row's). Demands
/// after the last decode end (a run stopped mid-decode) count as generation.
pub fn demands(records: &[TraceRecord]) -> Demands {
    let mut out = Demands::default();
    let mut pending: Vec<(Vec<SlotKey>, usize)> = Vec::new();
    let close = |out: &mut Demands, pending: &mut Vec<(Vec<SlotKey>, usize)>, prompt: bool| {
        for (keys, routed_ids) in pending.drain(..) {
            out.demands.push(Demand {
                keys,
                routed_ids,
                prompt,
            });
        }
    };
    for r in records {
        match r {
            TraceRecord::Demand { layer, ids } => {
                let mut experts: Vec<u16> = ids.clone();
                experts.sort_unstable();
                experts.dedup();
                let keys = experts.iter().map(|&e| SlotKey {
                    layer: *layer,
                    expert: u32::from(e),
                });
                pending.push((keys.collect(), ids.len()));
            }
            // Router weights do not change what the cache reads.
            TraceRecord::Weights { .. } => {}
            TraceRecord::DecodeEnd { rows, outputs } => {
                let prompt = outputs < rows;
                close(&mut out, &mut pending, prompt);
                out.decodes += 1;
                match prompt {
                    true => out.prompt_tokens += u64::from(*rows),
                    false => out.generation_tokens += u64::from(*rows),
                }
            }
        }
    }
    close(&mut out, &mut pending, false);
    out
}

/// What a replay counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayStats {
    pub hits: u64,
    pub misses: u64,
    pub read_bytes: u64,
    /// The same over generation decodes only.
    pub generation_hits: u64,
    pub generation_misses: u64,
    pub generation_read_bytes: u64,
    /// Of `generation_read_bytes`, the misses that took a free slot (none
    /// evicted for them): read into memory the cache never used before.
    pub generation_fill_bytes: u64,
}

impl ReplayStats {
    fn count(&mut self, prompt: bool, hits: u64, misses: u64, bytes: u64) {
        self.hits += hits;
        self.misses += misses;
        self.read_bytes += bytes;
        if !prompt {
            self.generation_hits += hits;
            self.generation_misses += misses;
            self.generation_read_bytes += bytes;
        }
    }

    /// Hit rate over every demand, in percent (the live summary's `moe-cache` hit).
    pub fn hit_pct(&self) -> f64 {
        pct(self.hits, self.misses)
    }

    pub fn generation_hit_pct(&self) -> f64 {
        pct(self.generation_hits, self.generation_misses)
    }
}

fn pct(hits: u64, misses: u64) -> f64 {
    match hits + misses {
        0 => 0.0,
        n => hits as f64 * 100.0 / n as f64,
    }
}

fn slot_bytes(header: &TraceHeader, key: SlotKey) -> u64 {
    header
        .slot_bytes
        .get(key.layer as usize)
        .copied()
        .unwrap_or(0)
}

/// The demands through the cache at `budget_bytes` under `policy`.
pub fn replay(
    header: &TraceHeader,
    d: &Demands,
    budget_bytes: u64,
    policy: CachePolicy,
) -> ReplayStats {
    replay_observed(
        header,
        d,
        CacheSetting {
            budget_bytes,
            policy,
        },
        &mut |_, _| {},
    )
}

/// The slots a generation decode missed, in the order it missed them (a slot
/// missed twice is there twice): what a run at that budget reads per token.
pub fn generation_misses(
    header: &TraceHeader,
    d: &Demands,
    budget_bytes: u64,
    policy: CachePolicy,
) -> Vec<SlotKey> {
    let mut out = Vec::new();
    replay_observed(
        header,
        d,
        CacheSetting {
            budget_bytes,
            policy,
        },
        &mut |prompt, key| {
            if !prompt {
                out.push(key);
            }
        },
    );
    out
}

/// One cache a trace is replayed through: its budget and eviction policy.
#[derive(Debug, Clone, Copy)]
struct CacheSetting {
    budget_bytes: u64,
    policy: CachePolicy,
}

/// [`replay`], telling `missed` of every demanded slot that missed (with
/// whether its demand was a prompt's).
fn replay_observed(
    header: &TraceHeader,
    d: &Demands,
    setting: CacheSetting,
    missed: &mut dyn FnMut(bool, SlotKey),
) -> ReplayStats {
    let CacheSetting {
        budget_bytes,
        policy,
    } = setting;
    let mut cache = ExpertCache::with_policy(budget_bytes, header.slot_bytes.clone(), policy);
    let mut stats = ReplayStats::default();
    // Slots the last prompt demand read ahead for the next layer.
    let mut read_ahead: Vec<SlotKey> = Vec::new();
    for demand in &d.demands {
        let plan = cache.request(Requester::Verify, &demand.keys);
        let bytes: u64 = plan.misses.iter().map(|k| slot_bytes(header, *k)).sum();
        let freed: u64 = plan.evict.iter().map(|k| slot_bytes(header, *k)).sum();
        if !demand.prompt {
            stats.generation_fill_bytes += bytes.saturating_sub(freed);
        }
        for &k in &plan.misses {
            missed(demand.prompt, k);
        }
        stats.count(
            demand.prompt,
            plan.hits.len() as u64,
            plan.misses.len() as u64,
            bytes,
        );
        let layer = demand.keys.first().map_or(0, |k| k.layer);
        if read_ahead.first().is_some_and(|k| k.layer == layer) {
            // As the flash actor judges a read-ahead: unused slots go first.
            read_ahead.retain(|k| demand.keys.binary_search(k).is_err());
            cache.demote(&read_ahead);
            cache.release_layer(Requester::Prefetch, layer);
            read_ahead.clear();
        }
        if let Some(next) = whole_next_layer(header, demand) {
            let absent: Vec<SlotKey> = next.into_iter().filter(|k| !cache.contains(*k)).collect();
            read_ahead = cache.request_more(Requester::Prefetch, &absent).misses;
            let bytes: u64 = read_ahead.iter().map(|k| slot_bytes(header, *k)).sum();
            stats.count(demand.prompt, 0, 0, bytes);
        }
    }
    stats
}

/// The next trunk layer's slots when `demand` is a prompt batch wide enough
/// for the flash actor to read that layer whole while this one computes.
fn whole_next_layer(header: &TraceHeader, demand: &Demand) -> Option<Vec<SlotKey>> {
    let layer = demand.keys.first()?.layer;
    let next = layer + 1;
    let has_experts = header.slot_bytes.get(next as usize).is_some_and(|&b| b > 0);
    let wide = reads_whole_layer(demand.routed_ids, header.n_expert);
    (demand.prompt && next < header.trunk_layers && has_experts && wide).then(|| {
        (0..header.n_expert)
            .map(|expert| SlotKey {
                layer: next,
                expert,
            })
            .collect()
    })
}

/// The offline optimum: on every miss over budget, give up the unpinned slots
/// needed furthest in the future (Belady's rule; optimal for equal slot sizes,
/// which every layer of a model usually has). A demand's own slots stay.
pub fn belady(header: &TraceHeader, d: &Demands, budget_bytes: u64) -> ReplayStats {
    let next = next_uses(d);
    let mut resident: HashMap<SlotKey, usize> = HashMap::new();
    let mut by_next: BTreeSet<(usize, SlotKey)> = BTreeSet::new();
    let mut resident_bytes = 0u64;
    let mut stats = ReplayStats::default();
    for (i, demand) in d.demands.iter().enumerate() {
        let (mut hits, mut misses, mut bytes) = (0, 0, 0);
        for (j, &k) in demand.keys.iter().enumerate() {
            match resident.insert(k, next[i][j]) {
                Some(old) => {
                    by_next.remove(&(old, k));
                    hits += 1;
                }
                None => {
                    misses += 1;
                    bytes += slot_bytes(header, k);
                    resident_bytes += slot_bytes(header, k);
                }
            }
            by_next.insert((next[i][j], k));
        }
        let victims: Vec<(usize, SlotKey)> = by_next
            .iter()
            .rev()
            .filter(|(_, k)| demand.keys.binary_search(k).is_err())
            .scan(resident_bytes, |over, &(n, k)| {
                (*over > budget_bytes).then(|| {
                    *over -= slot_bytes(header, k);
                    (n, k)
                })
            })
            .collect();
        for (n, k) in victims {
            by_next.remove(&(n, k));
            resident.remove(&k);
            resident_bytes -= slot_bytes(header, k);
        }
        stats.count(demand.prompt, hits, misses, bytes);
    }
    stats
}

/// For each demand's keys, the index of the next demand naming the same key
/// (`usize::MAX` when none does).
fn next_uses(d: &Demands) -> Vec<Vec<usize>> {
    let mut later: HashMap<SlotKey, usize> = HashMap::new();
    let mut out = vec![Vec::new(); d.demands.len()];
    for (i, demand) in d.demands.iter().enumerate().rev() {
        out[i] = demand
            .keys
            .iter()
            .map(|k| later.insert(*k, i).unwrap_or(usize::MAX))
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(layers: usize, n_expert: u32) -> TraceHeader {
        TraceHeader {
            n_expert,
            k: 1,
            trunk_layers: layers as u32,
            slot_bytes: vec![10; layers],
            model_bytes: 0,
            model_name: "t".into(),
        }
    }

    /// One single-row decode per token over `layers`, routing `route(token, layer)`.
    fn trace(tokens: u32, layers: u32, route: impl Fn(u32, u32) -> u16) -> Vec<TraceRecord> {
        let mut r = Vec::new();
        for t in 0..tokens {
            for l in 0..layers {
                r.push(TraceRecord::Demand {
                    layer: l,
                    ids: vec![route(t, l)],
                });
            }
            r.push(TraceRecord::DecodeEnd {
                rows: 1,
                outputs: 1,
            });
        }
        r
    }

    #[test]
    fn a_prompt_decode_is_told_from_generation() {
        let mut r = vec![
            TraceRecord::Demand {
                layer: 0,
                ids: vec![1; 20],
            },
            TraceRecord::DecodeEnd {
                rows: 20,
                outputs: 1,
            },
        ];
        r.extend(trace(3, 1, |_, _| 2));
        let d = demands(&r);
        assert_eq!(
            (d.prompt_tokens, d.generation_tokens, d.decodes),
            (20, 3, 4)
        );
        assert_eq!(d.demands[0].keys.len(), 1, "the union of the rows");
        assert!(d.demands[0].prompt && !d.demands[1].prompt);
    }

    #[test]
    fn generation_misses_are_the_reads_of_generation_in_order() {
        // A prompt routes to 5; generation loops a b c a b d a (room for 2, LRU).
        let mut r = vec![
            TraceRecord::Demand {
                layer: 0,
                ids: vec![5; 20],
            },
            TraceRecord::DecodeEnd {
                rows: 20,
                outputs: 1,
            },
        ];
        let seq = [0u16, 1, 2, 0, 1, 3, 0];
        r.extend(trace(seq.len() as u32, 1, |t, _| seq[t as usize]));
        let (h, d) = (header(1, 8), demands(&r));
        let misses = generation_misses(&h, &d, 20, CachePolicy::Lru);
        let experts: Vec<u32> = misses.iter().map(|k| k.expert).collect();
        assert_eq!(
            experts,
            seq.map(u32::from),
            "LRU misses every one, the prompt's 5 left out"
        );
        let s = replay(&h, &d, 20, CachePolicy::Lru);
        assert_eq!(misses.len() as u64, s.generation_misses);
        assert!(
            generation_misses(&h, &d, 80, CachePolicy::Lru).len() == 4,
            "a b c d once each"
        );
    }

    #[test]
    fn belady_on_a_known_sequence() {
        // Single layer, slots of 10 bytes, room for 2: a b c a b d a.
        let h = header(1, 8);
        let seq = [0u16, 1, 2, 0, 1, 3, 0];
        let d = demands(&trace(seq.len() as u32, 1, |t, _| seq[t as usize]));
        let opt = belady(&h, &d, 20);
        // c must be read (a demand's slot stays): b (needed later than a) goes;
        // a hits; b's read drops c (never again); d drops b; a hits.
        assert_eq!((opt.hits, opt.misses), (2, 5));
        let lru = replay(&h, &d, 20, CachePolicy::Lru);
        assert_eq!((lru.hits, lru.misses), (0, 7), "LRU thrashes on this loop");
        assert_eq!(lru.read_bytes, 70);
    }

    #[test]
    fn the_cycle_policy_beats_lru_on_layers_in_a_fixed_order() {
        // Each layer always routes to its own expert; the cache holds 3 of 4 layers.
        let h = header(4, 8);
        let d = demands(&trace(40, 4, |_, l| l as u16));
        let lru = replay(&h, &d, 30, CachePolicy::Lru);
        let cycle = replay(&h, &d, 30, CachePolicy::Cycle);
        let opt = belady(&h, &d, 30);
        assert_eq!(lru.hits, 0, "LRU evicts exactly the layer that runs next");
        assert!(cycle.hits >= opt.hits * 9 / 10, "{cycle:?} vs {opt:?}");
    }

    /// Property: over random traces and budgets, no policy beats the optimum
    /// and every policy's hits + misses are the demanded slots.
    #[test]
    fn no_policy_beats_belady() {
        let mut rng = bmoe_flash::xorshift::XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        for _ in 0..30 {
            let layers = 1 + (next() % 5) as u32;
            let experts = 2 + (next() % 10) as u32;
            let skew = next() % 3;
            let h = header(layers as usize, experts);
            let seeds: Vec<u64> = (0..200).map(|_| next()).collect();
            let d = demands(&trace(40, layers, |t, l| {
                let r = seeds[((t * layers + l) as usize) % seeds.len()];
                (r % u64::from(experts)).min(r % (skew + 1) * 3) as u16
            }));
            let total: u64 = d.demands.iter().map(|x| x.keys.len() as u64).sum();
            let budget = 10 * (next() % u64::from(layers * experts + 1));
            let opt = belady(&h, &d, budget);
            assert_eq!(opt.hits + opt.misses, total);
            for p in CachePolicy::ALL {
                let s = replay(&h, &d, budget, p);
                assert_eq!(s.hits + s.misses, total);
                assert!(s.hits <= opt.hits, "{p}: {s:?} beat {opt:?} at {budget}");
            }
        }
    }

    #[test]
    fn misses_into_free_slots_are_fills_and_misses_that_evict_are_not() {
        // One layer, 4 experts used in turn, 10 bytes a slot.
        let h = header(1, 4);
        let d = demands(&trace(8, 1, |t, _| (t % 4) as u16));
        // Room for all four: the first four tokens fill, the rest hit.
        let big = replay(&h, &d, 40, CachePolicy::Cycle);
        assert_eq!((big.generation_misses, big.generation_fill_bytes), (4, 40));
        // Room for one: every token misses, only the first into a free slot.
        let one = replay(&h, &d, 10, CachePolicy::Cycle);
        assert_eq!((one.generation_misses, one.generation_fill_bytes), (8, 10));
    }
}
