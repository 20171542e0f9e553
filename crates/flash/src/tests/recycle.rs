//! Page recycling across a quant mix: a projection whose slices differ in
//! size from one layer to the next still gets evicted pages of its own size.

use super::*;
use crate::proj::Proj;

const PAGE: u64 = 4096;

/// 3 layers x 4 experts; gate and up 2 pages a slice, down 2 pages in
/// layers 0 and 2 and 3 pages in layer 1 (as Q4_K_M's `ffn_down` alternates
/// Q4_K and Q6_K), over a pattern file.
fn mixed_specs() -> (tempfile::NamedTempFile, Vec<TensorSpec>) {
    let slice = |layer: u32, p: Proj| match (layer, p) {
        (1, Proj::Down) => 3 * PAGE,
        _ => 2 * PAGE,
    };
    let mut specs = Vec::new();
    let mut off = 0u64;
    for layer in 0..3 {
        for proj in Proj::ALL {
            let slice_bytes = slice(layer, proj);
            specs.push(TensorSpec {
                layer,
                proj,
                file_offset: off,
                slice_bytes,
                n_expert: 4,
            });
            off += 4 * slice_bytes;
        }
    }
    (pattern_file(off as usize), specs)
}

#[test]
fn a_projection_of_another_size_in_the_next_layer_still_reads_into_recycled_pages() {
    let (f, specs) = mixed_specs();
    let flash = Flash::spawn(
        &one_file(f.path()),
        specs.clone(),
        FlashConfig {
            budget_bytes: 0,
            request_capacity: 4,
            ..FlashConfig::default()
        },
    )
    .unwrap();
    let mut client = flash.client(Requester::Verify);
    let all = [0u32, 1, 2, 3];
    let pass = |client: &mut FlashClient| {
        for layer in 0..3 {
            let r = client.demand(layer, &all).unwrap();
            assert_eq!(r.misses, 4, "budget 0: every slot of layer {layer} is read");
        }
    };
    // The first pass fills fresh pages; after it, every miss takes the pages
    // of a slot just evicted, down included, whatever its layer's size.
    pass(&mut client);
    let faults = |f: &Flash| f.counters().touch.read_faults.load(Ordering::Relaxed);
    let before = faults(&flash);
    pass(&mut client);
    pass(&mut client);
    let fresh = faults(&flash) - before;
    // Reading layer 1's down (3 pages) into fresh memory would fault 12 pages
    // a pass, and layer 2's (2 pages) 8 more.
    assert!(fresh < 4, "{fresh} page faults in the reads of two passes");
    for s in specs.iter().filter(|s| s.layer == 2) {
        for e in all {
            let (dst, off, len) = flash.arena().slot(2, s.proj, e).unwrap();
            // SAFETY: resident and pinned by the last demand; nobody writes it now.
            let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
            assert_eq!(
                got,
                &expect(off, len)[..],
                "layer 2 {:?} expert {e}",
                s.proj
            );
        }
    }
}

#[test]
fn with_pages_touched_ahead_a_cache_that_grows_reads_into_them_without_faults() {
    let (f, specs) = mixed_specs();
    let cfg = |pretouch_bytes| FlashConfig {
        budget_bytes: 1 << 20,
        request_capacity: 4,
        pretouch_bytes,
        ..FlashConfig::default()
    };
    let faults = |f: &Flash| f.counters().touch.read_faults.load(Ordering::Relaxed);
    let all = [0u32, 1, 2, 3];
    // Without the toucher, each fresh slot faults its pages in on the read.
    let cold = Flash::spawn(&one_file(f.path()), specs.clone(), cfg(0)).unwrap();
    for layer in 0..3 {
        cold.client(Requester::Verify).demand(layer, &all).unwrap();
    }
    assert!(faults(&cold) >= 24, "{} faults", faults(&cold));
    // Cells of 3 pages (the widest slice): 42 of them, more than the 36 slices
    // read below, so no read depends on how soon the toucher refills one.
    let flash = Flash::spawn(&one_file(f.path()), specs.clone(), cfg(128 * PAGE)).unwrap();
    let mut client = flash.client(Requester::Verify);
    let c = flash.counters();
    let t0 = std::time::Instant::now();
    // The toucher fills its cells while the run computes; here, before it.
    while c.touch.pretouched_bytes.load(Ordering::Relaxed) < 42 * 3 * PAGE {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the toucher stalled"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for layer in 0..3 {
        let r = client.demand(layer, &all).unwrap();
        assert_eq!(r.misses, 4, "a cache that grows: layer {layer} is read");
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }
    let moved = c.touch.touched_bytes.load(Ordering::Relaxed);
    assert!(moved >= 4 * 2 * PAGE, "{moved} bytes given touched pages");
    assert!(
        faults(&flash) * 4 <= faults(&cold),
        "{} faults with the toucher, {} without",
        faults(&flash),
        faults(&cold)
    );
    for s in &specs {
        for e in all {
            let (dst, off, len) = flash.arena().slot(s.layer, s.proj, e).unwrap();
            // SAFETY: resident (the budget holds all 3 layers), nobody writes it now.
            let got = unsafe { std::slice::from_raw_parts(dst, len as usize) };
            assert_eq!(got, &expect(off, len)[..], "{s:?} expert {e}");
        }
    }
}
