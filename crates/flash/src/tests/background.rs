//! The flash actor's reads ahead of demand: temporal and hinted prefetch,
//! cold drops, the warm start, and a requester's background reads.

use super::*;

#[test]
fn temporal_prefetch_reads_the_next_layers_last_routing_and_counts_use() {
    let slice = 8192u64;
    let (f, specs) = layered_specs(3, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            budget_bytes: 0,
            queue_depth: 4,
            o_direct: true,
            request_capacity: 8,
            prefetch_layers: 1,
            prefetch_max_experts: 2,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let c = flash.counters().clone();
    let pf = |c: &FlashCounters| c.read_bytes[Requester::Prefetch.index()].load(Ordering::Relaxed);
    let mut client = flash.client(Requester::Verify);
    // Token 1: layers 0, 1, 2 (history is empty: nothing to prefetch yet).
    for (l, e) in [(0, [0, 1]), (1, [2, 3]), (2, [0, 3])] {
        let r = client.demand(l, &e).unwrap();
        assert_eq!(r.misses, 2);
    }
    // After layer 2 the window wraps to layer 0: its last routing {0, 1} is read ahead.
    wait_for("prefetch of layer 0", || pf(&c) == 6 * slice);
    let r = client.demand(0, &[0, 2]).unwrap();
    assert_eq!(
        (r.hits, r.misses),
        (1, 1),
        "expert 0 came from the prefetch"
    );
    // Judged at layer 0's demand: expert 0 useful, expert 1 wasted. The
    // actor judges after it has replied (off the demand's critical path).
    wait_for("layer 0's prefetch judged", || {
        c.prefetch.useful_bytes.load(Ordering::Relaxed)
            + c.prefetch.wasted_bytes.load(Ordering::Relaxed)
            >= 6 * slice
    });
    assert_eq!(c.prefetch.useful_bytes.load(Ordering::Relaxed), 3 * slice);
    assert_eq!(c.prefetch.wasted_bytes.load(Ordering::Relaxed), 3 * slice);
    // Now layer 1's history {2, 3} is read ahead.
    wait_for("prefetch of layer 1", || pf(&c) == 12 * slice);
    let r = client.demand(1, &[2, 3]).unwrap();
    assert_eq!((r.hits, r.misses), (2, 0));
    // Bytes: demand misses counted once, as the verify requester's; prefetch
    // whole experts (the next window may already be reading: at least 12 slices).
    let verify = c.read_bytes[Requester::Verify.index()].load(Ordering::Relaxed);
    assert_eq!(verify, (6 + 1) * 3 * slice);
    let prefetched = pf(&c);
    assert!(
        prefetched >= 12 * slice && prefetched % (3 * slice) == 0,
        "{prefetched}"
    );
    drop(client);
    assert!(flash.shutdown(Duration::from_secs(5)));
}

#[test]
fn prefetch_hints_and_cold_drops() {
    let slice = 8192u64;
    let (_f, flash) = small_flash(slice);
    let c = flash.counters().clone();
    let mut client = flash.client(Requester::Verify);
    client.demand(0, &[0]).unwrap();
    // A prediction for layer 1 is read on idle slots and pinned until layer 1's demand.
    client.prefetch(1, &[1, 2]);
    wait_for("hinted prefetch", || {
        c.read_bytes[Requester::Prefetch.index()].load(Ordering::Relaxed) == 6 * slice
    });
    // Droppable expert 2 is resident (prefetched): kept; expert 3 is a miss: dropped.
    let r = client
        .demand_with(1, &[1, 2, 3], &[2, 3], false, Some((2, &[1])))
        .unwrap();
    assert_eq!(r.dropped, vec![3]);
    assert_eq!((r.hits, r.misses), (2, 0));
    assert_eq!(c.dropped_experts.load(Ordering::Relaxed), 1);
    wait_for("layer 1's prefetch judged", || {
        c.prefetch.useful_bytes.load(Ordering::Relaxed) >= 6 * slice
    });
    assert_eq!(c.prefetch.useful_bytes.load(Ordering::Relaxed), 6 * slice);
    // The hint sent behind the demand is read ahead for layer 2.
    wait_for("hint behind a demand", || {
        c.read_bytes[Requester::Prefetch.index()].load(Ordering::Relaxed) == 9 * slice
    });
    // Out-of-range hints are ignored, not fatal.
    client.prefetch(2, &[99]);
    let r = client.demand(2, &[1]).unwrap();
    assert_eq!(r.hits, 1);
    drop(client);
    assert!(flash.shutdown(Duration::from_secs(5)));
}

#[test]
fn warm_start_fills_free_budget_only_counts_use_and_decode_routing() {
    let slice = 8192u64;
    let slot = 3 * slice;
    let (f, specs) = layered_specs(3, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            // Room for four slots.
            budget_bytes: 4 * slot,
            request_capacity: 8,
            prefetch_max_experts: 2,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let c = flash.counters().clone();
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut verify = flash.client(Requester::Verify);
    // A single token's routing at layer 0: counted for the profile.
    assert_eq!(verify.demand(0, &[0, 1]).unwrap().misses, 2);
    let key = |layer, expert| crate::cache::SlotKey { layer, expert };
    // Planned: one resident already (skipped), two that fit, then no room.
    let keys = vec![key(0, 1), key(1, 2), key(2, 3), key(2, 0), key(9, 9)];
    assert!(flash.warm(keys, vec![(key(1, 2), 0.5)]));
    wait_for("warm reads", || ld(&c.warm.queued_slots) == 0);
    assert_eq!(ld(&c.warm.read_slots), 2);
    assert_eq!(ld(&c.warm.read_bytes), 2 * slot);
    assert_eq!(
        ld(&c.warm.skipped_slots),
        3,
        "no such slot, resident first, then no room"
    );
    assert_eq!(ld(&c.read_bytes[Requester::Verify.index()]), 2 * slot);
    assert_eq!(c.read_bytes_total(), 4 * slot);
    // A demand hitting a warm slot uses it; a second hit is not counted again.
    let r = verify.demand(1, &[2, 3]).unwrap();
    assert_eq!((r.hits, r.misses), (1, 1));
    assert_eq!(verify.demand(1, &[2]).unwrap().hits, 1);
    assert_eq!(ld(&c.warm.used_slots), 1);
    // A prompt batch (wider than k) is not a token's routing: not counted.
    verify.demand(2, &[0, 1, 2, 3]).unwrap();
    let uses = c.decode_uses.snapshot();
    assert_eq!(c.decode_uses.stride, 4);
    assert_eq!(&uses[0..4], &[1, 1, 0, 0]);
    assert_eq!(&uses[4..8], &[0, 0, 2, 1]);
    assert_eq!(&uses[8..12], &[0, 0, 0, 0]);
    drop(verify);
    assert!(flash.shutdown(Duration::from_secs(5)));
}

#[test]
fn background_reads_are_pinned_for_their_requester_and_counted_as_its_bytes() {
    let slice = 8192u64;
    let (_f, flash) = small_flash(slice);
    let c = flash.counters().clone();
    let bytes = |r: Requester| c.read_bytes[r.index()].load(Ordering::Relaxed);
    let mut verify = flash.client(Requester::Verify);
    let mut draft = flash.client(Requester::Draft);
    assert_eq!(draft.demand(2, &[0]).unwrap().misses, 1);
    // Read on idle slots for the draft requester, pinned as its own.
    draft.background(2, &[1, 2, 99]);
    wait_for("background reads", || {
        c.background_read_bytes.load(Ordering::Relaxed) == 6 * slice
    });
    assert_eq!(bytes(Requester::Draft), 9 * slice);
    assert_eq!(bytes(Requester::Prefetch), 0);
    // With a zero budget only pins keep slots: the verify requester's demand
    // does not evict the draft requester's background slots.
    assert_eq!(verify.demand(0, &[0, 1, 2, 3]).unwrap().misses, 4);
    let r = draft.demand(2, &[1, 2, 3]).unwrap();
    assert_eq!((r.hits, r.misses), (2, 1), "the background slots were kept");
    // A demand of the requester drops its queued background work; the actor
    // keeps serving (no read of an out-of-range expert, no hang).
    draft.background(1, &[0, 1, 2, 3]);
    let r = draft.demand(1, &[0]).unwrap();
    assert_eq!(r.hits + r.misses, 1);
    let r = verify.demand(1, &[3]).unwrap();
    assert_eq!(r.hits + r.misses, 1);
    drop((verify, draft));
    assert!(flash.shutdown(Duration::from_secs(5)));
}
