//! The io_uring reader under a seeded faulty ring: thousands of reads at depth
//! 16 with reordering, held-back completions, short reads, EAGAIN, EINTR (in
//! completions and in waits) and EIO. Every completed request holds exactly the
//! file's bytes or the call fails; no read is in flight when a call returns;
//! a failure never poisons the next request.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

const FILE_BYTES: usize = 4 << 20;
const MAX_SLICE: u64 = 20_000;
const OPS_PER_BATCH: usize = 24;

fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 11) as u8 ^ (i >> 12) as u8
}

fn pattern_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).unwrap();
    let data: Vec<u8> = (0..FILE_BYTES as u64).map(byte_at).collect();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    f
}

fn faulty_uring(
    path: &Path,
    plan: &str,
    direct: bool,
) -> (UringReader, Arc<FaultCounts>, Arc<AtomicU64>) {
    let ring = FaultyRing::open(path, plan.parse().unwrap(), 32).unwrap();
    let (counts, pending) = (ring.counts(), ring.pending());
    let reader = UringReader::with_ring(Box::new(ring), path.into(), direct, 16, MAX_SLICE)
        .map_err(|(_, e)| e)
        .unwrap();
    (reader, counts, pending)
}

/// A cheap seeded generator for the test's own choices.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Two pools of destinations used in turn, so a late write from the previous
/// call would land in memory the test checks again.
struct Pools {
    bufs: [Vec<Vec<u8>>; 2],
}

impl Pools {
    fn new() -> Self {
        let pool = || vec![vec![0u8; MAX_SLICE as usize]; OPS_PER_BATCH];
        Self {
            bufs: [pool(), pool()],
        }
    }
}

/// Run `batches` calls of random slices; returns (calls served, calls failed).
fn stress(reader: &mut UringReader, pending: &AtomicU64, batches: u32, seed: u64) -> (u32, u32) {
    let mut rng = Lcg(seed);
    let mut pools = Pools::new();
    let (mut ok, mut failed) = (0, 0);
    let mut last: Option<(usize, Vec<(u64, u64)>)> = None;
    for b in 0..batches {
        let p = (b % 2) as usize;
        let mut ops = Vec::with_capacity(OPS_PER_BATCH);
        let mut spans = Vec::with_capacity(OPS_PER_BATCH);
        for (i, buf) in pools.bufs[p].iter_mut().enumerate() {
            let len = 1 + rng.below(MAX_SLICE);
            let off = if i % 3 == 0 {
                rng.below((FILE_BYTES as u64 - MAX_SLICE) / 4096) * 4096
            } else {
                rng.below(FILE_BYTES as u64 - len)
            };
            buf.fill(0xAA);
            spans.push((off, len));
            ops.push(ReadOp {
                dst: buf.as_mut_ptr(),
                file_offset: off,
                len,
            });
        }
        // SAFETY: each destination is its own buffer of MAX_SLICE >= len bytes,
        // untouched by the test until read_all returns.
        let res = unsafe { reader.read_all(&ops) };
        assert_eq!(
            pending.load(Ordering::Relaxed),
            0,
            "call {b} returned ({}) with reads still in flight",
            if res.is_ok() { "ok" } else { "error" }
        );
        let served = res.is_ok();
        match res {
            Ok(_) => {
                ok += 1;
                for (i, &(off, len)) in spans.iter().enumerate() {
                    let want: Vec<u8> = (off..off + len).map(byte_at).collect();
                    let got = &pools.bufs[p][i][..len as usize];
                    assert!(
                        got == &want[..],
                        "call {b} op {i} ({off}+{len}): other bytes"
                    );
                }
            }
            Err(e) => {
                failed += 1;
                let msg = e.to_string();
                assert!(msg.contains("Input/output error"), "call {b}: {msg}");
            }
        }
        // The previous call's served bytes were not overwritten after it returned.
        if let Some((q, spans)) = last.take() {
            for (i, &(off, len)) in spans.iter().enumerate() {
                let want: Vec<u8> = (off..off + len).map(byte_at).collect();
                assert!(
                    pools.bufs[q][i][..len as usize] == want[..],
                    "call {} op {i}: written after the call returned",
                    b - 1
                );
            }
        }
        if served {
            last = Some((p, spans));
        }
    }
    (ok, failed)
}

const EVERY_FAULT: &str =
    "seed=SEED,eio=0.004,short=0.1,eagain=0.05,eintr=0.05,delay=0.4,slow=0.001,slow_ms=1";

#[test]
fn uring_reader_under_every_fault_serves_exact_bytes_or_an_error() {
    let f = pattern_file();
    for (seed, direct) in [(1u64, false), (2, true), (3, false), (4, true)] {
        let plan = EVERY_FAULT.replace("SEED", &seed.to_string());
        let (mut r, counts, pending) = faulty_uring(f.path(), &plan, direct);
        let (ok, failed) = stress(&mut r, &pending, 150, seed);
        assert_eq!(
            r.stale_completions(),
            0,
            "every completion was the current call's"
        );
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        println!(
            "seed {seed} direct {direct}: {ok} ok, {failed} failed; {}",
            counts.summary()
        );
        assert!(
            ok > 20 && failed > 5,
            "both outcomes exercised: {ok} ok, {failed} failed"
        );
        assert!(
            l(&counts.reads) > 3000
                && l(&counts.short) > 0
                && l(&counts.eagain) > 0
                && l(&counts.eintr) > 0
                && l(&counts.delayed) > 0
                && l(&counts.wait_eintr) > 0,
            "every fault injected: {}",
            counts.summary()
        );
    }
}

#[test]
fn uring_reader_with_transient_faults_only_serves_every_call() {
    let f = pattern_file();
    let plan = "seed=7,short=0.2,eagain=0.05,eintr=0.05,delay=0.5";
    let (mut r, counts, pending) = faulty_uring(f.path(), plan, true);
    let (ok, failed) = stress(&mut r, &pending, 100, 7);
    assert_eq!((ok, failed), (100, 0), "{}", counts.summary());
}

#[test]
fn a_ring_smaller_than_the_depth_waits_for_room_and_serves_every_read() {
    // 24 reads a call at depth 16 through a ring that holds 2: a full
    // submission queue waits for a completion, then pushes.
    let f = pattern_file();
    for (seed, direct, plan) in [
        (21u64, false, "seed=21"),
        (22, true, "seed=22"),
        (
            23,
            true,
            "seed=23,short=0.2,eagain=0.05,eintr=0.05,delay=0.5",
        ),
    ] {
        let ring = FaultyRing::open(f.path(), plan.parse().unwrap(), 2).unwrap();
        let (counts, pending) = (ring.counts(), ring.pending());
        let mut r = UringReader::with_ring(Box::new(ring), f.path().into(), direct, 16, MAX_SLICE)
            .map_err(|(_, e)| e)
            .unwrap();
        let (ok, failed) = stress(&mut r, &pending, 60, seed);
        assert_eq!((ok, failed), (60, 0), "{plan}: {}", counts.summary());
        assert_eq!(r.stale_completions(), 0);
    }
}

#[test]
fn a_kernel_ring_smaller_than_the_depth_serves_every_read() {
    // 8 submission entries (16 completions) under a reader of depth 16.
    let f = pattern_file();
    for direct in [true, false] {
        let file = std::fs::File::open(f.path()).unwrap();
        let Ok(ring) = KernelRing::new(file, 8) else {
            println!("io_uring unavailable here: the kernel ring is not tested");
            return;
        };
        let mut r = UringReader::with_ring(Box::new(ring), f.path().into(), direct, 16, MAX_SLICE)
            .map_err(|(_, e)| e)
            .unwrap();
        let pending = AtomicU64::new(0);
        let (ok, failed) = stress(&mut r, &pending, 60, 31);
        assert_eq!((ok, failed), (60, 0));
    }
}

#[test]
fn kernel_ring_at_depth_16_reads_thousands_of_slices_exactly() {
    let f = pattern_file();
    for direct in [true, false] {
        let file = std::fs::File::open(f.path()).unwrap();
        let Ok(mut r) = UringReader::new(file, f.path().into(), direct, 16, MAX_SLICE) else {
            println!("io_uring unavailable here: the kernel ring is not tested");
            return;
        };
        let pending = AtomicU64::new(0);
        let (ok, failed) = stress(&mut r, &pending, 100, 11);
        assert_eq!((ok, failed), (100, 0));
    }
}

#[test]
fn after_a_failed_read_the_same_actor_serves_the_next_demand_exactly() {
    let slice = 8192u64;
    let (f, specs) = super::tests::layered_specs(3, slice);
    let plan = "seed=9,eio=0.05,short=0.2,eintr=0.1,delay=0.5"
        .parse()
        .unwrap();
    let ring = FaultyRing::open(f.path(), plan, 64).unwrap();
    let counts = ring.counts();
    let reader = UringReader::with_ring(Box::new(ring), f.path().into(), false, 16, slice)
        .map_err(|(_, e)| e)
        .unwrap();
    super::tests::faults::served_bytes_are_exact_after_failures(
        Box::new(reader),
        f.path(),
        &specs,
        &counts,
    );
}

/// A ring that takes reads and never completes them: every wait fails.
struct DeadRing;

impl Ring for DeadRing {
    unsafe fn push_read(&mut self, _dst: *mut u8, _len: u32, _offset: u64, _tag: u64) -> bool {
        true
    }
    fn submit_and_wait(&mut self, _want: usize) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EBADF))
    }
    fn reap(&mut self, _out: &mut Vec<(u64, i32)>) {}
}

#[test]
fn a_ring_that_stops_answering_wedges_the_reader_for_good() {
    let mut r = UringReader::with_ring(Box::new(DeadRing), "dead".into(), false, 4, 4096)
        .map_err(|(_, e)| e)
        .unwrap();
    // Leaked on purpose: a wedged reader's destinations must never be freed.
    let buf: &'static mut [u8] = Vec::leak(vec![0u8; 4 * 4096]);
    let ops: Vec<ReadOp> = (0..3)
        .map(|i| ReadOp {
            dst: buf[i * 4096..].as_mut_ptr(),
            file_offset: i as u64 * 4096,
            len: 4096,
        })
        .collect();
    // SAFETY: the destinations are leaked, so valid for ever.
    let e = unsafe { r.read_all(&ops) }.unwrap_err();
    assert!(e.to_string().contains("stopped answering"), "{e}");
    assert_eq!(
        r.in_flight(),
        3,
        "the reads it could not drain are reported"
    );
    // SAFETY: as above.
    let e = unsafe { r.read_all(&ops[..1]) }.unwrap_err();
    assert!(e.to_string().contains("3 reads never completed"), "{e}");
}
