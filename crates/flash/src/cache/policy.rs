//! Which unpinned slot the cache gives up first ([`CachePolicy`]), and the
//! per-slot use counts the frequency-aware policies rank by ([`UseCounts`]).

use std::str::FromStr;

use super::slot_map::SlotKey;
use super::slot_map::SlotMap;

/// The eviction order of the expert cache. Slots demoted by prefetch (guessed,
/// then not used) go first under every policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Least recently used first.
    Lru,
    /// Least often used first (counts halved every [`AGE_PASSES`] passes, so
    /// old popularity fades), least recently used among equals.
    Lfu,
    /// Layers run in a fixed order, so a slot's next possible use is known up
    /// to whether it is routed: the slot with the longest expected time to its
    /// next use goes first. In layer steps from the current layer c, over n
    /// layers, a slot of layer l used on a share p of passes is next needed
    /// after d(l) + n (1/p - 1) steps, d(l) = (l - c - 1) mod n + 1. The
    /// default before `Learned`.
    Cycle,
    /// `Cycle`'s longest expected wait, d(l) + n (1/q - 1), at a chance q of
    /// being routed at the layer's next visit learned online from every
    /// slot's recency and decayed frequency ([`super::ReuseModel`]), blended
    /// with the slot's own share of passes while the table is thin. The default: the best hit rate of the
    /// policies on every real trace of docs/cache.md, tune and holdout splits.
    #[default]
    Learned,
}

impl CachePolicy {
    pub const ALL: [CachePolicy; 4] = [
        CachePolicy::Lru,
        CachePolicy::Lfu,
        CachePolicy::Cycle,
        CachePolicy::Learned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
            CachePolicy::Cycle => "cycle",
            CachePolicy::Learned => "learned",
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown cache policy {s:?} (expected lru, lfu, cycle or learned)")
            })
    }
}

/// Passes (a decode's walk through the layers) between two halvings of the
/// use counts: long enough to tell hot from cold, short enough that a topic
/// change is followed within a few dozen tokens.
pub const AGE_PASSES: u32 = 64;

/// How often each slot was demanded (by verify and draft decodes), counted
/// whether or not it is resident, with the passes that saw them.
#[derive(Debug, Default, Clone)]
pub struct UseCounts {
    uses: SlotMap<u32>,
    passes: u32,
    /// The layer of the last verify demand (the pass's position).
    layer: Option<u32>,
}

impl UseCounts {
    /// A verify demand of `layer`: a layer at or before the last one starts a pass.
    pub fn verify_layer(&mut self, layer: u32) {
        if self.layer.is_none_or(|last| layer <= last) {
            self.passes += 1;
            if self.passes % AGE_PASSES == 0 {
                self.age();
            }
        }
        self.layer = Some(layer);
    }

    /// Start from an earlier run's routing: as if `passes` passes had routed
    /// each slot at its rate (uses per pass, at most 1). Aging fades them like
    /// any count.
    pub fn seed(&mut self, passes: u32, rates: &[(SlotKey, f32)]) {
        self.passes += passes;
        for &(k, r) in rates {
            let n = (f64::from(r.clamp(0.0, 1.0)) * f64::from(passes)).round() as u32;
            if n > 0 {
                *self.uses.get_or_insert_with(k, || 0) += n;
            }
        }
    }

    pub fn used(&mut self, key: SlotKey) {
        *self.uses.get_or_insert_with(key, || 0) += 1;
    }

    fn age(&mut self) {
        self.uses.retain(|n| {
            *n /= 2;
            *n > 0
        });
        self.passes /= 2;
    }

    pub fn uses(&self, key: SlotKey) -> u32 {
        self.uses.get(&key).copied().unwrap_or(0)
    }

    /// Expected layer steps until `key` is next demanded (the cycle policy's
    /// rank: larger goes first), over `n_layers` layers.
    pub fn steps_to_next_use(&self, key: SlotKey, n_layers: u32) -> f64 {
        let n = n_layers.max(1);
        let d = self.steps_to_layer(key.layer, n);
        f64::from(d) + f64::from(n) * (1.0 / self.use_share(key) - 1.0)
    }

    /// The share of passes that routed `key` (Laplace's estimate, at most 1).
    pub fn use_share(&self, key: SlotKey) -> f64 {
        let p = (f64::from(self.uses(key)) + 1.0) / (f64::from(self.passes) + 2.0);
        p.min(1.0)
    }

    /// Passes counted (halved every [`AGE_PASSES`]).
    pub fn passes(&self) -> u32 {
        self.passes
    }

    /// Layer steps from the last verify demand's layer to `layer`'s next
    /// visit, d(l) = (l - c - 1) mod n + 1, in 1..=n over `n_layers` layers.
    pub fn steps_to_layer(&self, layer: u32, n_layers: u32) -> u32 {
        let n = n_layers.max(1);
        let current = self.layer.unwrap_or(n - 1);
        (layer % n + n - current % n - 1) % n + 1
    }
}

/// Expected share of a layer's experts that `routed_ids` random picks leave
/// out is about e^(-routed_ids / n_expert): at this many picks per expert it
/// is under 10%, and a batch's next layer is read whole ahead of its routing.
const WHOLE_LAYER_PICKS_PER_EXPERT: f64 = std::f64::consts::LN_10;

/// Whether a batch routing `routed_ids` expert picks in a layer of
/// `n_expert` will need (nearly) all of the next layer's experts.
pub fn reads_whole_layer(routed_ids: usize, n_expert: u32) -> bool {
    n_expert > 0 && routed_ids as f64 >= WHOLE_LAYER_PICKS_PER_EXPERT * f64::from(n_expert)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(layer: u32, expert: u32) -> SlotKey {
        SlotKey { layer, expert }
    }

    #[test]
    fn a_batch_reads_the_next_layer_whole_once_it_picks_each_expert_about_twice() {
        assert!(!reads_whole_layer(4, 64), "one token");
        assert!(!reads_whole_layer(140, 64));
        assert!(reads_whole_layer(148, 64));
        assert!(reads_whole_layer(1384 * 4, 64), "a long prompt");
        assert!(!reads_whole_layer(100, 0));
    }

    #[test]
    fn names_parse_back() {
        for p in CachePolicy::ALL {
            assert_eq!(p.name().parse::<CachePolicy>(), Ok(p));
        }
        assert!("mru"
            .parse::<CachePolicy>()
            .unwrap_err()
            .contains("lru, lfu, cycle or learned"));
    }

    #[test]
    fn the_layer_just_run_is_furthest_and_popular_slots_are_nearer() {
        let mut u = UseCounts::default();
        for _ in 0..4 {
            for layer in 0..4 {
                u.verify_layer(layer);
                u.used(k(layer, 0));
            }
        }
        // At layer 3: layer 0 runs next, layer 3 last.
        assert_eq!(
            u.steps_to_next_use(k(0, 0), 4),
            1.0 + 4.0 * (6.0 / 5.0 - 1.0)
        );
        assert!(u.steps_to_next_use(k(3, 0), 4) > u.steps_to_next_use(k(0, 0), 4));
        // An expert never used is far off whatever its layer.
        assert!(u.steps_to_next_use(k(0, 1), 4) > u.steps_to_next_use(k(3, 0), 4));
    }

    #[test]
    fn a_seed_counts_as_passes_at_the_given_rates() {
        let mut u = UseCounts::default();
        u.seed(32, &[(k(0, 1), 0.5), (k(1, 2), 2.0), (k(1, 3), 0.001)]);
        assert_eq!((u.passes, u.uses(k(0, 1)), u.uses(k(1, 2))), (32, 16, 32));
        assert_eq!(u.uses(k(1, 3)), 0);
        assert!(u.steps_to_next_use(k(0, 1), 2) < u.steps_to_next_use(k(0, 0), 2));
    }

    #[test]
    fn counts_age_every_few_dozen_passes() {
        let mut u = UseCounts::default();
        for _ in 0..AGE_PASSES - 1 {
            u.verify_layer(0);
            u.used(k(0, 0));
        }
        assert_eq!(u.uses(k(0, 0)), AGE_PASSES - 1);
        u.verify_layer(0);
        assert_eq!(u.uses(k(0, 0)), (AGE_PASSES - 1) / 2);
        assert_eq!(u.passes, AGE_PASSES / 2);
    }
}
