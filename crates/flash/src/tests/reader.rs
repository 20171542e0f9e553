//! The slice readers against a real file: exact bytes at several depths,
//! direct and buffered, and what reading past the end or a refused O_DIRECT does.

use super::*;

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
    // A page-aligned destination reads in place (O_DIRECT returns the file's
    // unaligned tail); one a byte off goes through a bounce buffer.
    let layout = std::alloc::Layout::from_size_align(8192 + 4096, 4096).unwrap();
    // SAFETY: non-zero size layout; freed below.
    let base = unsafe { std::alloc::alloc_zeroed(layout) };
    let readers = || -> Vec<(&str, Box<dyn SliceReader>)> {
        let direct_pread = PreadReader::open_direct(f.path(), 64 * 1024).unwrap();
        vec![
            (
                "io_uring direct",
                open_reader(f.path(), true, 2, 64 * 1024).unwrap().0,
            ),
            (
                "io_uring buffered",
                open_reader(f.path(), false, 2, 64 * 1024).unwrap().0,
            ),
            ("pread direct", Box::new(direct_pread)),
        ]
    };
    for skew in [0usize, 1] {
        for (name, mut r) in readers() {
            let op = ReadOp {
                // SAFETY: skew < 4096, inside the allocation.
                dst: unsafe { base.add(skew) },
                file_offset: 8192,
                len: 8192,
            };
            // SAFETY: dst is valid for 8192 bytes (the allocation holds 12288).
            let e = unsafe { r.read_all(&[op]) }.unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("truncated"), "{name} skew={skew}: {msg}");
        }
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(base, layout) };
}

#[test]
fn o_direct_refused_falls_back_to_buffered_with_a_note() {
    // procfs refuses O_DIRECT (EINVAL at open), like some filesystems do.
    let path = std::path::Path::new("/proc/version");
    let expected = std::fs::read(path).unwrap();
    let (mut r, notes) = open_reader(path, true, 2, 4096).unwrap();
    assert!(!r.direct(), "fell back to buffered reads");
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, ReaderNote::DirectRefused { .. })),
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
