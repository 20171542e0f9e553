//! The `learned` policy's model of reuse: the chance that a slot is routed at
//! its layer's next visit, learned online from every slot's history.
//!
//! Each demand of a layer is a visit of that layer. A slot's history is two
//! numbers: the visits of its layer since it was last routed (recency, capped)
//! and a decayed count of the visits that routed it (frequency, on a square-root
//! scale into buckets). At each visit, every slot of the layer the cache has
//! seen is a trial of its (recency, frequency) bucket and a success when the
//! visit routes it; the bucket's success rate is the slot's chance at its next
//! visit. Nothing about the future is known: the table is what has happened.

use super::slot_map::SlotKey;
use super::slot_map::SlotMap;

/// Per visit, a slot's decayed count is multiplied by this before its use is
/// added (a memory of about 20 visits). Tuned on the tune splits of
/// docs/cache.md's traces (0.8..0.98 tried).
const DECAY: f32 = 0.95;
/// Recency buckets: routed 1, 2, .., RECENCY_BUCKETS visits ago; the last
/// bucket also holds older ones, and one more holds never-routed slots.
const RECENCY_BUCKETS: usize = 8;
/// Frequency buckets over the decayed count's range [0, 1 / (1 - DECAY)].
const FREQUENCY_BUCKETS: usize = 8;
const BUCKETS: usize = (RECENCY_BUCKETS + 1) * FREQUENCY_BUCKETS;
/// Trials the table starts each bucket with, at a success rate of
/// PRIOR_SUCCESSES: an unseen bucket ranks as an unlikely slot.
const PRIOR_TRIALS: f64 = 1.0;
const PRIOR_SUCCESSES: f64 = 0.05;
/// The slot's own share of passes weighs as much as this many passes of the
/// learned table: passes/(passes + OWN_SHARE_PASSES) is the table's weight.
/// Early in a run (few passes, thin buckets) the slot's own share leads; the
/// ageing keeps passes at 32..64, so it keeps a weight of 0.24-0.38 after.
/// Tuned on the tune splits (5, 10, 20, 40, 80, 300 tried; docs/cache.md).
const OWN_SHARE_PASSES: f64 = 20.0;

/// A slot's chance of reuse for the `learned` rank: the table's `learned`
/// chance blended with `own`, the slot's own share of passes that routed it
/// and the passes counted ([`super::policy::UseCounts`]).
pub fn blended(learned: f64, own: (f64, u32)) -> f64 {
    let (share, passes) = own;
    let w = f64::from(passes) / (f64::from(passes) + OWN_SHARE_PASSES);
    let q = w * learned + (1.0 - w) * share;
    debug_assert!(q > 0.0 && q <= 1.0, "{q}");
    q
}

#[derive(Debug, Clone, Copy, Default)]
struct History {
    /// The layer's visit that last routed the slot (0: never).
    last_routed: u64,
    decayed_uses: f32,
}

/// Learned chance of reuse per (layer, expert) slot; see the module doc.
#[derive(Debug, Clone)]
pub struct ReuseModel {
    history: SlotMap<History>,
    /// Visits so far, per layer (a slot's first visit is number 1).
    visits: Vec<u64>,
    trials: [f64; BUCKETS],
    successes: [f64; BUCKETS],
}

impl Default for ReuseModel {
    fn default() -> Self {
        Self {
            history: SlotMap::default(),
            visits: Vec::new(),
            trials: [0.0; BUCKETS],
            successes: [0.0; BUCKETS],
        }
    }
}

impl ReuseModel {
    /// A demand of `layer` routed `routed` (that layer's keys): one trial of
    /// every slot of the layer seen so far, then the routed ones' histories.
    pub fn visit(&mut self, layer: u32, routed: &[SlotKey]) {
        debug_assert!(routed.iter().all(|k| k.layer == layer), "{routed:?}");
        let l = layer as usize;
        if self.visits.len() <= l {
            self.visits.resize(l + 1, 0);
        }
        let seen = self.visits[l];
        self.visits[l] = seen + 1;
        let mut used = Vec::new();
        for k in routed {
            let e = k.expert as usize;
            if used.len() <= e {
                used.resize(e + 1, false);
            }
            used[e] = true;
        }
        let (trials, successes) = (&mut self.trials, &mut self.successes);
        for (expert, h) in self.history.row_mut(layer) {
            let hit = used.get(expert as usize).copied().unwrap_or(false);
            let b = bucket(seen, *h);
            trials[b] += 1.0;
            successes[b] += f64::from(u8::from(hit));
            h.decayed_uses = h.decayed_uses * DECAY + f32::from(u8::from(hit));
            if hit {
                h.last_routed = seen + 1;
            }
        }
        // A slot routed for the first time starts its history here (it was
        // no trial: the cache had not seen it).
        for k in routed {
            self.history.get_or_insert_with(*k, || History {
                last_routed: seen + 1,
                decayed_uses: 1.0,
            });
        }
    }

    /// The learned chance that `key` is routed at its layer's next visit.
    pub fn chance(&self, key: SlotKey) -> f64 {
        let h = self.history.get(&key).copied().unwrap_or_default();
        let visits = self.visits.get(key.layer as usize).copied().unwrap_or(0);
        let b = bucket(visits, h);
        (self.successes[b] + PRIOR_SUCCESSES) / (self.trials[b] + PRIOR_TRIALS)
    }
}

/// The bucket of a slot with history `h` once its layer has had `visits` visits.
fn bucket(visits: u64, h: History) -> usize {
    // 0: routed at the layer's latest visit.
    let recency = match h.last_routed {
        0 => RECENCY_BUCKETS,
        last => (visits.saturating_sub(last) as usize).min(RECENCY_BUCKETS - 1),
    };
    let full = 1.0 / (1.0 - DECAY);
    let share = (h.decayed_uses / full).clamp(0.0, 1.0);
    let f = ((share.sqrt() * FREQUENCY_BUCKETS as f32) as usize).min(FREQUENCY_BUCKETS - 1);
    recency * FREQUENCY_BUCKETS + f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(layer: u32, expert: u32) -> SlotKey {
        SlotKey { layer, expert }
    }

    #[test]
    fn a_slot_routed_every_visit_is_likelier_than_one_routed_once() {
        let mut m = ReuseModel::default();
        // Expert 0 every visit, expert 1 at the first only, expert 2 every other.
        for v in 0..40 {
            let mut routed = vec![k(0, 0)];
            if v == 0 {
                routed.push(k(0, 1));
            }
            if v % 2 == 0 {
                routed.push(k(0, 2));
            }
            m.visit(0, &routed);
        }
        let (every, once, alternate) = (m.chance(k(0, 0)), m.chance(k(0, 1)), m.chance(k(0, 2)));
        assert!(every > 0.9, "{every}");
        assert!(once < 0.1, "{once}");
        assert!(once < alternate && alternate < every, "{alternate}");
    }

    #[test]
    fn the_chance_is_what_the_bucket_saw() {
        let mut m = ReuseModel::default();
        // Expert 1 routed at every third visit: right after a use it comes
        // back two visits later, never at the next one.
        for v in 0..300 {
            let routed: Vec<SlotKey> = match v % 3 {
                0 => vec![k(0, 0), k(0, 1)],
                _ => vec![k(0, 0)],
            };
            m.visit(0, &routed);
        }
        // The last visit (299) was 2 mod 3: expert 1 is due next.
        let due = m.chance(k(0, 1));
        m.visit(0, &[k(0, 0), k(0, 1)]);
        let just_used = m.chance(k(0, 1));
        assert!(due > 0.9, "{due}");
        assert!(just_used < 0.1, "{just_used}");
    }

    #[test]
    fn the_slots_own_share_leads_early_and_the_table_later() {
        // No passes yet: the slot's own share alone.
        assert!((blended(0.9, (0.1, 0)) - 0.1).abs() < 1e-12);
        // Many passes: mostly the table.
        let late = blended(0.9, (0.1, 1_000));
        assert!(late > 0.88 && late < 0.9, "{late}");
        // Between: between the two.
        let mid = blended(0.9, (0.1, 20));
        assert!((mid - 0.5).abs() < 1e-12, "{mid}");
    }

    #[test]
    fn unseen_slots_and_layers_rank_as_unlikely() {
        let mut m = ReuseModel::default();
        m.visit(3, &[k(3, 5)]);
        assert!(m.chance(k(7, 1)) <= PRIOR_SUCCESSES / PRIOR_TRIALS + 1e-9);
        assert!(m.chance(k(3, 0)) < 0.5);
    }
}
