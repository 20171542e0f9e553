//! The arena's slots: layout, release and the page moves (recycled slots,
//! the toucher's cells, the mapping budget).

use super::*;

/// Whether each page of [begin, end) is resident (`mincore`).
fn resident(begin: usize, end: usize, page: usize) -> Vec<bool> {
    let mut v = vec![0u8; (end - begin) / page];
    // SAFETY: [begin, end) is whole pages of the arena's live mapping and
    // `v` has a byte per page.
    let rc = unsafe { libc::mincore(begin as *mut libc::c_void, end - begin, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    v.iter().map(|b| b & 1 == 1).collect()
}

/// Slot `e`'s bytes.
fn bytes(a: &Arena, e: u32) -> &[u8] {
    let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
    // SAFETY: the slot is inside the arena's live mapping.
    unsafe { std::slice::from_raw_parts(dst, len as usize) }
}

#[test]
fn a_slot_that_is_not_a_page_multiple_moves_its_own_pages_and_spares_its_neighbours() {
    let page = Arena::new(&[]).unwrap().page;
    let slice = 3 * page as u64 + 1000;
    let spec = TensorSpec {
        layer: 0,
        proj: Proj::Gate,
        file_offset: 0,
        slice_bytes: slice,
        n_expert: 4,
    };
    let a = Arena::new(&[spec]).unwrap();
    for e in 0..3u32 {
        let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
        // SAFETY: the slot is inside the arena's live mapping, nothing reads it.
        unsafe { std::ptr::write_bytes(dst, e as u8 + 1, len as usize) };
    }
    let inner = |e: u32| {
        let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
        a.inner_pages(dst, len)
    };
    let (to_begin, to_end) = inner(3);
    assert!(
        resident(to_begin, to_end, page).iter().all(|r| !r),
        "never written"
    );
    assert!(a.move_slot(Proj::Gate, (0, 1), (0, 3)));
    let (from_begin, from_end) = inner(1);
    assert!(
        resident(from_begin, from_end, page).iter().all(|r| !r),
        "the moved slot keeps no page of its own"
    );
    let moved = ((from_end - from_begin) / page).min((to_end - to_begin) / page);
    assert!(moved >= 2, "{moved}");
    let now = resident(to_begin, to_end, page);
    assert!(now[..moved].iter().all(|r| *r), "the miss's pages: {now:?}");
    for e in [0u32, 2] {
        assert!(
            bytes(&a, e).iter().all(|&b| b == e as u8 + 1),
            "neighbour {e}"
        );
    }
    // The moved slot's edge pages are shared, so they stay; its own read zero.
    let one = bytes(&a, 1);
    let (start, _, _) = a.slot(0, Proj::Gate, 1).unwrap();
    let head = from_begin - start as usize;
    assert!(one[..head].iter().all(|&b| b == 2));
    assert!(one[head..head + moved * page].iter().all(|&b| b == 0));
    assert!(
        !a.move_slot(Proj::Gate, (0, 2), (0, 2)),
        "a slot onto itself"
    );
}

#[test]
fn past_the_mapping_budget_a_new_range_is_refused_and_an_old_one_moves() {
    let page = Arena::new(&[]).unwrap().page as u64;
    let spec = TensorSpec {
        layer: 0,
        proj: Proj::Gate,
        file_offset: 0,
        slice_bytes: 2 * page,
        n_expert: 4,
    };
    let a = Arena::with_move_budget(&[spec], 1).unwrap();
    for e in 0..3u32 {
        let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
        // SAFETY: the slot is inside the arena's live mapping, nothing reads it.
        unsafe { std::ptr::write_bytes(dst, e as u8 + 1, len as usize) };
    }
    assert!(a.move_slot(Proj::Gate, (0, 0), (0, 3)), "the one new range");
    assert!(
        !a.move_slot(Proj::Gate, (0, 1), (0, 2)),
        "a second is refused"
    );
    assert!(bytes(&a, 1).iter().all(|&b| b == 2), "nothing moved");
    assert!(bytes(&a, 2).iter().all(|&b| b == 3));
    assert!(a.move_slot(Proj::Gate, (0, 2), (0, 3)), "moved into before");
    assert!(bytes(&a, 3).iter().all(|&b| b == 3));
}

/// An arena of one Gate region of `n` experts, each 3 pages and 1,000 bytes
/// (so their inner page counts differ), every slot filled with its number + 1.
fn uneven(n: u32) -> (Arena, usize) {
    let page = Arena::new(&[]).unwrap().page;
    let spec = TensorSpec {
        layer: 0,
        proj: Proj::Gate,
        file_offset: 0,
        slice_bytes: 3 * page as u64 + 1000,
        n_expert: n,
    };
    let a = Arena::new(&[spec]).unwrap();
    for e in 0..n {
        let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
        // SAFETY: the slot is inside the arena's live mapping, nothing reads it.
        unsafe { std::ptr::write_bytes(dst, e as u8 + 1, len as usize) };
    }
    (a, page)
}

#[test]
fn a_slot_moved_into_in_part_gives_only_the_pages_that_are_one_mapping() {
    let (a, page) = uneven(5);
    let inner = |e: u32| {
        let (dst, _, len) = a.slot(0, Proj::Gate, e).unwrap();
        let (b, e) = a.inner_pages(dst, len);
        (e - b) / page
    };
    assert_eq!((inner(0), inner(1), inner(4)), (3, 2, 3), "the geometry");
    // Slot 1's two pages become slot 0's first two: its third is still the
    // region's mapping, so slot 0 is now two mappings.
    assert!(a.move_slot(Proj::Gate, (0, 1), (0, 0)));
    assert_eq!(a.moves.one_mapping_pages(0, 0, 3), 2);
    // A move of all three would span both (mremap refuses that, and Linux
    // 5.7-6.15 unmap slot 4 first): only the two move.
    assert!(
        a.move_slot(Proj::Gate, (0, 0), (0, 4)),
        "the two pages move"
    );
    assert_eq!(a.moves.one_mapping_pages(0, 4, 3), 2);
    let (dst, _, len) = a.slot(0, Proj::Gate, 4).unwrap();
    // SAFETY: slot 4 is inside the arena's live mapping, nothing reads it.
    unsafe { std::ptr::write_bytes(dst, 9, len as usize) };
    assert!(bytes(&a, 4).iter().all(|&b| b == 9), "slot 4 is all mapped");
    assert!(bytes(&a, 3).iter().all(|&b| b == 4), "its neighbour kept");
    assert!(a.lost().is_none());
}

#[test]
fn a_hole_a_refused_move_left_is_mapped_again_and_a_mapped_range_kept() {
    let page = Arena::new(&[]).unwrap().page;
    let buf = AnonBuffer::zeroed(4 * page).unwrap();
    let base = buf.as_ptr() as usize;
    // SAFETY: the buffer's own 4 pages.
    unsafe { std::ptr::write_bytes(buf.as_ptr(), 7, 4 * page) };
    // SAFETY: pages 1 and 2 of the buffer, which nothing else uses; the
    // test maps them again below before the buffer is dropped.
    let unmapped = unsafe { libc::munmap((base + page) as *mut _, 2 * page) };
    assert_eq!(unmapped, 0);
    // SAFETY: the hole is the buffer's range.
    let again = unsafe { map_again(base + page, 2 * page) };
    assert_eq!(again, Some(Remapped::MappedAgain));
    // SAFETY: the buffer's 4 pages, all mapped again.
    let all = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), 4 * page) };
    assert!(
        all[page..3 * page].iter().all(|&b| b == 0),
        "fresh zero pages"
    );
    assert!(all[..page].iter().chain(&all[3 * page..]).all(|&b| b == 7));
    all[page] = 1;
    // SAFETY: the buffer's range, mapped.
    let again = unsafe { map_again(base, 4 * page) };
    assert_eq!(again, Some(Remapped::Refused), "already mapped");
    assert_eq!((all[0], all[page]), (7, 1), "and left as it was");
}
