//! The flash actor's demands: budget, hits and evictions, bytes where the
//! layout says, the split gate/up then down reply, and shutdown.

use super::*;

#[test]
fn flash_actor_serves_demands_within_budget_and_counts_bytes() {
    // Two layers x 3 projections x 4 experts of 8 KiB, laid out contiguously.
    let slice = 8192u64;
    let (f, specs) = layered_specs(2, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs.clone(),
        FlashConfig {
            budget_bytes: 3 * slice * 2, // two (layer, expert) slots
            queue_depth: 4,
            o_direct: true,
            request_capacity: 4,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let mut client = flash.client(Requester::Verify);
    let r = client.demand(0, &[1, 3]).unwrap();
    assert_eq!((r.hits, r.misses, r.evictions), (0, 2, 0));
    assert_eq!(r.read_bytes, 6 * slice);
    // The bytes are where the tensor layout says.
    for s in specs.iter().filter(|s| s.layer == 0) {
        for e in [1u32, 3] {
            let (dst, off, len) = flash.arena().slot(0, s.proj, e).unwrap();
            assert_eq!(off, s.file_offset + e as u64 * slice);
            // SAFETY: the slot is resident and pinned; nobody writes it now.
            let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
            assert_eq!(got, &expect(off, len)[..]);
        }
    }
    let r = client.demand(1, &[0]).unwrap();
    assert_eq!(
        (r.hits, r.misses, r.evictions),
        (0, 1, 1),
        "one LRU slot evicted"
    );
    let r = client.demand(0, &[3]).unwrap();
    assert_eq!(r.hits, 1, "expert 3 of layer 0 was the most recent");
    let e = client.demand(0, &[9]).unwrap_err();
    assert!(e.to_string().contains("expert 9"), "{e}");
    // Overlap: gate/up first, down after; both land where the layout says.
    let r = client.demand_gate_up(1, &[2, 3]).unwrap();
    assert_eq!(r.read_bytes, 4 * slice, "gate and up of two misses");
    assert!(client.down_pending());
    let d = client.wait_down().unwrap();
    assert_eq!(d.read_bytes, 2 * slice, "down of two misses");
    assert!(!client.down_pending());
    for p in crate::proj::Proj::ALL {
        for e in [2u32, 3] {
            let (dst, off, len) = flash.arena().slot(1, p, e).unwrap();
            // SAFETY: resident and pinned; nobody writes it now.
            let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
            assert_eq!(got, &expect(off, len)[..], "layer 1 proj {p:?} expert {e}");
        }
    }
    assert_eq!(client.wait_down().unwrap().read_bytes, 0, "nothing pending");
    let c = flash.counters().clone();
    assert_eq!(c.read_bytes_total(), 15 * slice);
    assert!(c.peak_resident_bytes.load(Ordering::Relaxed) <= 6 * slice);
    drop(client);
    assert!(flash.shutdown(Duration::from_secs(5)));
}

#[test]
fn shutdown_is_a_message_and_a_join_even_with_clients_held() {
    let slice = 8192u64;
    let (f, specs) = layered_specs(1, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            budget_bytes: 3 * slice * 4,
            queue_depth: 4,
            o_direct: false,
            request_capacity: 4,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let mut client = flash.client(Requester::Verify);
    client.demand(0, &[0, 1]).unwrap();
    // The client is still alive: the actor stops on the message, not on the
    // channel closing, and says so before the deadline.
    let t0 = std::time::Instant::now();
    assert!(flash.shutdown(Duration::from_secs(5)), "stopped and joined");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let e = client.demand(0, &[2]).unwrap_err();
    assert!(
        matches!(e, FlashError::RequestsClosed | FlashError::NoReply),
        "{e}"
    );
}
