//! Loading: a streamed load leaves the experts unread (llama.cpp's mapping is
//! not populated); a resident load reads the whole file, as before.

use std::path::Path;

use crate::common::{bmoe, e8k2, fixture_dir, stderr};

/// Drop `path` from the page cache (clean pages: no privilege needed).
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: advisory call on a file descriptor we own.
    let r = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(r, 0);
}

/// The share of the pages of `ranges` (file offset, bytes) of `path` that
/// are in the page cache.
fn cached_share(path: &Path, ranges: &[(u64, u64)]) -> f64 {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only mapping of a file nobody writes during the test.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let page = 4096u64;
    let (mut cached, mut total) = (0u64, 0u64);
    for &(off, len) in ranges {
        let (a, b) = (off.div_ceil(page) * page, (off + len) / page * page);
        if b <= a {
            continue;
        }
        let n = ((b - a) / page) as usize;
        let mut vec = vec![0u8; n];
        // [a, b) lies inside the mapping (the ranges are the file's
        // tensors); `vec` has one byte per page.
        // SAFETY: as the comment above says.
        let r = unsafe {
            libc::mincore(
                map.as_ptr().add(a as usize) as *mut libc::c_void,
                (b - a) as usize,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        cached += vec.iter().filter(|&&v| v & 1 == 1).count() as u64;
        total += n as u64;
    }
    cached as f64 / total.max(1) as f64
}

#[test]
fn a_streamed_load_leaves_the_experts_unread() {
    // A private copy: other tests read the shared fixture (same page cache).
    let dir = tempfile::tempdir_in(fixture_dir()).unwrap();
    let model = dir.path().join("e8k2.gguf");
    std::fs::copy(e8k2(), &model).unwrap();
    std::fs::File::open(&model).unwrap().sync_all().unwrap();
    let m = model.to_str().unwrap();
    let layout = bmoe::layout::MoeLayout::open(&model).unwrap();
    let experts: Vec<(u64, u64)> = layout
        .experts
        .iter()
        .map(|e| (e.file_offset, e.bytes()))
        .collect();
    let run = |flags: &[&str]| {
        evict(&model);
        let args = [&["run", "-m", m, "-p", "Hello", "-n", "1"][..], flags].concat();
        let o = bmoe(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        (cached_share(&model, &experts), stderr(&o))
    };
    let (streamed, err) = run(&["--cache-mb", "0"]);
    assert!(
        streamed < 0.25,
        "streamed load cached {streamed:.2} of the experts"
    );
    assert!(err.contains("experts left unread"), "{err}");
    let (resident, err) = run(&["--resident"]);
    assert!(
        resident > 0.9,
        "resident load cached {resident:.2} of the experts"
    );
    assert!(err.contains("mapped and populated"), "{err}");
}
