//! Reads through the fault-injecting source: short, refused and slow reads
//! still deliver exact bytes, persistent faults stop, failed reads are never served.

use super::*;

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
pub(crate) fn served_bytes_are_exact_after_failures(
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
