//! The reader and the flash actor against a real file (no model needed).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::cache::Requester;

/// A file whose byte at offset i is a function of i.
fn pattern_file(len: usize) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(2654435761).rotate_right(13) as u8)
        .collect();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    f
}

/// A model in one file.
fn one_file(path: &std::path::Path) -> [ShardFile; 1] {
    [ShardFile {
        path: path.to_path_buf(),
        base: 0,
    }]
}

fn expect(off: u64, len: u64) -> Vec<u8> {
    (off..off + len)
        .map(|i| i.wrapping_mul(2654435761).rotate_right(13) as u8)
        .collect()
}

fn check_reader(direct: bool, depth: u32) {
    let f = pattern_file(1 << 20);
    let (mut r, notes) = open_reader(f.path(), direct, depth, 64 * 1024).unwrap();
    if !notes.is_empty() {
        println!("reader notes (fallbacks taken): {notes:?}");
    }
    // Aligned and unaligned slices, some crossing page boundaries, one at the tail.
    let cases: [(u64, u64); 6] = [
        (0, 4096),
        (4096, 65536),
        (100, 5000),
        (8191, 3),
        (123_456, 40_000),
        ((1 << 20) - 700, 700),
    ];
    let mut bufs: Vec<Vec<u8>> = cases.iter().map(|c| vec![0u8; c.1 as usize]).collect();
    // An aligned destination for the aligned case so the direct path is used.
    let layout = std::alloc::Layout::from_size_align(65536, 4096).unwrap();
    // SAFETY: non-zero size layout; freed below.
    let aligned = unsafe { std::alloc::alloc_zeroed(layout) };
    let mut ops: Vec<ReadOp> = cases
        .iter()
        .zip(bufs.iter_mut())
        .map(|(c, b)| ReadOp {
            dst: b.as_mut_ptr(),
            file_offset: c.0,
            len: c.1,
        })
        .collect();
    ops[1].dst = aligned;
    // SAFETY: every destination is valid for its length and untouched until return.
    let stats = unsafe { r.read_all(&ops) }.unwrap();
    assert!(stats.device_bytes >= cases.iter().map(|c| c.1).sum::<u64>());
    for (i, (c, b)) in cases.iter().zip(&bufs).enumerate() {
        if i == 1 {
            continue;
        }
        assert_eq!(b, &expect(c.0, c.1), "case {i} {c:?} direct={direct}");
    }
    // SAFETY: `aligned` holds 65536 initialised bytes after the read.
    let got = unsafe { std::slice::from_raw_parts(aligned, 65536) }.to_vec();
    assert_eq!(got, expect(4096, 65536));
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(aligned, layout) };
}

#[test]
fn reads_exact_bytes_direct_and_buffered_at_several_depths() {
    for depth in [1, 4, 16] {
        check_reader(true, depth);
        check_reader(false, depth);
    }
}

#[test]
fn reading_past_the_end_is_an_error_not_garbage() {
    let f = pattern_file(10_000);
    for direct in [true, false] {
        let (mut r, _) = open_reader(f.path(), direct, 2, 64 * 1024).unwrap();
        let mut buf = vec![0u8; 8192];
        let op = ReadOp {
            dst: buf.as_mut_ptr(),
            file_offset: 8192,
            len: 8192,
        };
        // SAFETY: buf is valid for 8192 bytes.
        let e = unsafe { r.read_all(&[op]) }.unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}

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

/// `layers` x 3 projections x 4 experts of `slice` bytes over a pattern file.
pub(super) fn layered_specs(layers: u32, slice: u64) -> (tempfile::NamedTempFile, Vec<TensorSpec>) {
    let f = pattern_file((layers as u64 * 3 * 4 * slice) as usize);
    let mut specs = Vec::new();
    for layer in 0..layers {
        for proj in crate::proj::Proj::ALL {
            specs.push(TensorSpec {
                layer,
                proj,
                file_offset: ((layer as u64 * 3 + proj.index() as u64) * 4) * slice,
                slice_bytes: slice,
                n_expert: 4,
            });
        }
    }
    (f, specs)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

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
    // Judged at layer 0's demand: expert 0 useful, expert 1 wasted.
    assert_eq!(c.prefetch_useful_bytes.load(Ordering::Relaxed), 3 * slice);
    assert_eq!(c.prefetch_wasted_bytes.load(Ordering::Relaxed), 3 * slice);
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

/// A flash actor over three layers of four `slice`-byte experts, zero budget.
fn small_flash(slice: u64) -> (tempfile::NamedTempFile, Flash) {
    let (f, specs) = layered_specs(3, slice);
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs,
        FlashConfig {
            budget_bytes: 0,
            request_capacity: 8,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    (f, flash)
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
    assert_eq!(c.prefetch_useful_bytes.load(Ordering::Relaxed), 6 * slice);
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
    wait_for("warm reads", || ld(&c.warm_queued_slots) == 0);
    assert_eq!(ld(&c.warm_read_slots), 2);
    assert_eq!(ld(&c.warm_read_bytes), 2 * slot);
    assert_eq!(
        ld(&c.warm_skipped_slots),
        3,
        "no such slot, resident first, then no room"
    );
    assert_eq!(ld(&c.read_bytes[Requester::Verify.index()]), 2 * slot);
    assert_eq!(c.read_bytes_total(), 4 * slot);
    // A demand hitting a warm slot uses it; a second hit is not counted again.
    let r = verify.demand(1, &[2, 3]).unwrap();
    assert_eq!((r.hits, r.misses), (1, 1));
    assert_eq!(verify.demand(1, &[2]).unwrap().hits, 1);
    assert_eq!(ld(&c.warm_used_slots), 1);
    // A prompt batch (wider than k) is not a token's routing: not counted.
    verify.demand(2, &[0, 1, 2, 3]).unwrap();
    let uses = c.decode_uses_snapshot();
    assert_eq!(c.uses_stride, 4);
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

#[test]
fn o_direct_refused_falls_back_to_buffered_with_a_note() {
    // procfs refuses O_DIRECT (EINVAL at open), like some filesystems do.
    let path = std::path::Path::new("/proc/version");
    let expected = std::fs::read(path).unwrap();
    let (mut r, notes) = open_reader(path, true, 2, 4096).unwrap();
    assert!(!r.direct(), "fell back to buffered reads");
    assert!(
        notes.iter().any(|n| n.contains("refuses O_DIRECT")),
        "the fallback is reported: {notes:?}"
    );
    let n = expected.len().min(32) as u64;
    let mut buf = vec![0u8; n as usize];
    let op = ReadOp {
        dst: buf.as_mut_ptr(),
        file_offset: 0,
        len: n,
    };
    // SAFETY: buf is valid for n bytes.
    unsafe { r.read_all(&[op]) }.unwrap();
    assert_eq!(&buf[..], &expected[..n as usize]);
}

fn faulty_reader(path: &std::path::Path, plan: &str) -> (PreadReader, Arc<FaultCounts>) {
    let src = FaultySource::open(path, plan.parse().unwrap()).unwrap();
    let counts = src.counts();
    (
        PreadReader::new(Box::new(src), path, 64 * 1024).unwrap(),
        counts,
    )
}

#[test]
fn short_reads_eagain_and_slow_reads_still_deliver_exact_bytes() {
    let f = pattern_file(1 << 20);
    let (mut r, counts) =
        faulty_reader(f.path(), "seed=3,short=0.5,eagain=0.3,slow=0.05,slow_ms=1");
    for i in 0..200u64 {
        let off = (i * 7919 * 13) % ((1 << 20) - 20_000);
        let len = 1 + (i * 104729) % 20_000;
        let mut buf = vec![0u8; len as usize];
        let op = ReadOp {
            dst: buf.as_mut_ptr(),
            file_offset: off,
            len,
        };
        // SAFETY: buf is valid for len bytes and used by no one else.
        let stats = unsafe { r.read_all(&[op]) }.unwrap();
        assert_eq!(buf, expect(off, len), "read {i} at {off}+{len}");
        assert_eq!(stats.device_bytes, len);
    }
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    assert!(
        l(&counts.short) > 50 && l(&counts.eagain) > 20 && l(&counts.slow) > 0,
        "{}",
        counts.summary()
    );
}

#[test]
fn persistent_faults_stop_with_the_error_after_bounded_retries() {
    let f = pattern_file(1 << 16);
    let mut buf = vec![0u8; 4096];
    let op = ReadOp {
        dst: buf.as_mut_ptr(),
        file_offset: 0,
        len: 4096,
    };
    let (mut r, counts) = faulty_reader(f.path(), "eagain=1");
    // SAFETY: buf is valid for 4096 bytes.
    let e = unsafe { r.read_all(&[op]) }.unwrap_err();
    assert!(e.to_string().contains("temporarily unavailable"), "{e}");
    assert_eq!(
        counts.eagain.load(Ordering::Relaxed),
        9,
        "first try + 8 retries"
    );
    let (mut r, _) = faulty_reader(f.path(), "eio=1");
    // SAFETY: as above.
    let e = unsafe { r.read_all(&[op]) }.unwrap_err();
    assert!(e.to_string().contains("Input/output error"), "{e}");
}

#[test]
fn a_failed_read_is_never_served_and_a_later_demand_rereads() {
    let slice = 8192u64;
    let (f, specs) = layered_specs(3, slice);
    let src = FaultySource::open(f.path(), "seed=9,eio=0.3".parse().unwrap()).unwrap();
    let counts = src.counts();
    let reader = PreadReader::new(Box::new(src), f.path(), slice).unwrap();
    served_bytes_are_exact_after_failures(Box::new(reader), f.path(), &specs, &counts);
}

/// Demands through a faulty reader: every served slot holds exactly the file's
/// bytes, failures are I/O errors, and both happen.
pub(super) fn served_bytes_are_exact_after_failures(
    reader: Box<dyn SliceReader>,
    _path: &std::path::Path,
    specs: &[TensorSpec],
    counts: &FaultCounts,
) {
    let flash = Flash::spawn_with_reader(
        reader,
        Vec::new(),
        specs.to_vec(),
        FlashConfig {
            budget_bytes: 1 << 20,
            ..FlashConfig::default()
        },
        &[],
    )
    .unwrap();
    let mut client = flash.client(Requester::Verify);
    let (mut ok, mut failed) = (0, 0);
    for round in 0..40u32 {
        let layer = round % 3;
        let experts = [round % 4, (round + 1) % 4];
        match client.demand(layer, &experts) {
            Ok(_) => {
                ok += 1;
                // Whatever was served holds exactly the file's bytes.
                for s in specs.iter().filter(|s| s.layer == layer) {
                    for e in experts {
                        let (dst, off, len) = flash.arena().slot(layer, s.proj, e).unwrap();
                        // SAFETY: resident and pinned by this requester; nobody writes it now.
                        let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
                        assert_eq!(got, &expect(off, len)[..], "round {round}");
                    }
                }
            }
            Err(e) => {
                failed += 1;
                assert!(e.to_string().contains("Input/output error"), "{e}");
            }
        }
    }
    assert!(
        ok > 0 && failed > 0,
        "{ok} served, {failed} failed; {}",
        counts.summary()
    );
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
    assert!(matches!(e, FlashError::Stopped(_)), "{e}");
}
