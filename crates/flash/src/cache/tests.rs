//! The cache's state machine under every policy.

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
    let mut rng = crate::xorshift::XorShift::new(0x1234_5678_9abc_def0);
    let mut next = || rng.next_u64();
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
            let sum: u64 = c.entries.iter().map(|(k, _)| sizes[k.layer as usize]).sum();
            assert_eq!(sum, c.resident_bytes(), "trial {trial}");
            assert!(
                c.resident_bytes() <= c.limit_bytes(),
                "trial {trial}: over budget"
            );
        }
    }
}

#[test]
fn warm_slots_replace_only_slots_demanded_less_often() {
    let mut c = ExpertCache::with_policy(300, vec![100; 4], CachePolicy::Cycle);
    c.seed_counts(32, &[(k(2, 0), 0.5), (k(2, 1), 0.25), (k(0, 1), 0.25)]);
    // Free room for one: (2, 0) goes in without evicting anything.
    let (a, e) = c.admit_replacing(&[k(2, 0)]);
    assert_eq!((a, e), (vec![k(2, 0)], vec![]));
    // A prompt's demand fills the rest; (0, 1) was routed often, (0, 2) never.
    c.request(Requester::Verify, &[k(0, 1), k(0, 2)]);
    c.release(Requester::Verify);
    // (2, 1) takes the place of (0, 2) (used once), not of (0, 1) or (2, 0);
    // (2, 2) was never routed: it replaces nothing and the rest is not tried.
    let (a, e) = c.admit_replacing(&[k(2, 1), k(2, 2), k(2, 3)]);
    assert_eq!((a, e), (vec![k(2, 1)], vec![k(0, 2)]));
    assert!(c.contains(k(0, 1)) && c.contains(k(2, 0)));
    assert_eq!(c.resident_bytes(), 300);
    // Pinned slots are never replaced.
    c.request(Requester::Verify, &[k(1, 0)]);
    let mut c2 = ExpertCache::new(100, vec![100; 4]);
    c2.request(Requester::Verify, &[k(1, 0)]);
    c2.seed_counts(32, &[(k(3, 3), 1.0)]);
    assert_eq!(c2.admit_replacing(&[k(3, 3)]), (vec![], vec![]));
}
