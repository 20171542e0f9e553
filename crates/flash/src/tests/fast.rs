//! All-hit demands answered by the client ([`FlashClient::try_hits`]): the
//! file's bytes, the policy still told of every hit, and a held slot never
//! evicted under its reader.

use super::*;
use crate::cache::CachePolicy;

/// A flash actor over three layers of four 8 KiB experts, `slots` of budget.
fn lru_flash(slots: u64) -> (tempfile::NamedTempFile, Vec<TensorSpec>, Flash) {
    let slice = 8192u64;
    let (f, specs) = layered_specs(3, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs.clone(),
        FlashConfig {
            budget_bytes: slots * 3 * slice,
            request_capacity: 8,
            policy: CachePolicy::Lru,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    (f, specs, flash)
}

/// Whether every projection of (layer, expert) holds the file's bytes.
fn holds_file_bytes(flash: &Flash, specs: &[TensorSpec], layer: u32, expert: u32) -> bool {
    specs.iter().filter(|s| s.layer == layer).all(|s| {
        let (dst, off, len) = flash.arena().slot(layer, s.proj, expert).unwrap();
        // SAFETY: the caller holds the slot pinned; nobody writes it meanwhile.
        let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
        got == &expect(off, len)[..]
    })
}

#[test]
fn an_all_hit_demand_is_answered_by_the_client_with_the_files_bytes() {
    let (_f, specs, flash) = lru_flash(8);
    let mut c = flash.client(Requester::Verify);
    assert!(c.try_hits(0, &[1, 3]).is_none(), "nothing is resident yet");
    let r = c.demand(0, &[1, 3]).unwrap();
    assert_eq!((r.hits, r.misses), (0, 2));
    let r = c.try_hits(0, &[1, 3]).expect("both resident");
    assert_eq!((r.hits, r.misses, r.read_bytes), (2, 0, 0));
    assert!(holds_file_bytes(&flash, &specs, 0, 1));
    assert!(holds_file_bytes(&flash, &specs, 0, 3));
    assert!(c.try_hits(0, &[1, 2]).is_none(), "one miss: the round trip");
    let hits = &flash.counters().hits[Requester::Verify.index()];
    assert_eq!(hits.load(Ordering::Relaxed), 2, "the fast hits are counted");
    let r = c.demand(0, &[1, 2]).unwrap();
    assert_eq!((r.hits, r.misses), (1, 1));
}

#[test]
fn fast_hits_reach_the_policys_recency() {
    // Two slots, LRU: (0,0) then (0,1) read; a fast hit on (0,0) makes it the
    // most recent, so the next miss evicts (0,1), as after a round trip.
    let (_f, _specs, flash) = lru_flash(2);
    let mut c = flash.client(Requester::Verify);
    c.demand(0, &[0]).unwrap();
    c.demand(0, &[1]).unwrap();
    assert!(c.try_hits(0, &[0]).is_some());
    let r = c.demand(0, &[2]).unwrap();
    assert_eq!((r.misses, r.evictions), (1, 1));
    assert!(c.try_hits(0, &[0]).is_some(), "the fast-hit slot stayed");
    assert!(c.try_hits(0, &[1]).is_none(), "the least recent one went");
}

#[test]
fn a_slot_held_by_a_fast_answer_is_evicted_only_once_released() {
    let (_f, specs, flash) = lru_flash(2);
    let mut a = flash.client(Requester::Verify);
    a.demand(0, &[0]).unwrap();
    assert!(a.try_hits(0, &[0]).is_some());
    // Another verify client drops the requester's cache pins, and the budget
    // goes to zero: the actor must evict (0,0), which `a` still reads.
    flash.client(Requester::Verify).release();
    flash.set_budget(0);
    std::thread::sleep(Duration::from_millis(100));
    let evictions = || flash.counters().evictions.load(Ordering::Relaxed);
    assert_eq!(evictions(), 0, "evicted under its reader");
    assert!(
        holds_file_bytes(&flash, &specs, 0, 0),
        "overwritten under its reader"
    );
    a.end_pass();
    wait_for("the eviction once released", || evictions() == 1);
    assert!(
        a.try_hits(0, &[0]).is_none(),
        "an evicted slot is never answered"
    );
}

#[test]
fn temporal_prefetch_keeps_the_round_trip() {
    let (f, specs) = layered_specs(2, 8192);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            budget_bytes: 1 << 20,
            prefetch_layers: 1,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let mut c = flash.client(Requester::Verify);
    c.demand(0, &[0]).unwrap();
    assert!(
        c.try_hits(0, &[0]).is_none(),
        "its queue follows each demand"
    );
}
