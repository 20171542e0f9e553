//! Which slot ranges the arena has moved pages into, and how many it may.
//!
//! Each move into a slot (a recycled slot's pages, a toucher's cell) makes
//! that range a mapping of its own, splitting the region around it, and the
//! split stays after the slot is released: the process's mapping count grows
//! with the distinct ranges ever moved into, up to the kernel's
//! `vm.max_map_count` (65,530 by default), past which any `mmap` (an
//! allocation) fails. Past a share of it, a new range is read into its own
//! pages (faults) instead; ranges moved into before stay free to move into
//! again (the move replaces their mapping).
//!
//! A move may also cover only the first pages of a slot (slices that are not
//! page multiples have one inner page more or less): the rest stays another
//! mapping. `mremap` refuses a source that spans two mappings, and Linux
//! 5.7-6.15 unmap the destination before they check that, so a move only ever
//! takes a slot's pages that are one mapping ([`MapBudget::one_mapping_pages`]).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Mappings one new moved-into range may cost at most (its split, and the
/// source's), as a divisor of the kernel's limit: the rest of the process
/// keeps at least a third of it. (Measured: 5,732 mappings after 3,500 moves.)
const MAPPINGS_PER_RANGE: usize = 6;

/// The kernel's default `vm.max_map_count`.
const DEFAULT_MAX_MAP_COUNT: usize = 65_530;

/// Per (region, expert): the pages the last move into it covered (0: never
/// moved into, its pages all lie in the region's own mapping); and how many
/// ranges were ever moved into.
#[derive(Debug)]
pub(crate) struct MapBudget {
    moved_pages: Vec<AtomicU32>,
    stride: usize,
    ranges: AtomicUsize,
    max_ranges: usize,
}

impl MapBudget {
    /// `n_regions` regions of at most `stride` experts, at most `max_ranges`
    /// distinct ranges moved into.
    pub(crate) fn new(n_regions: usize, stride: usize, max_ranges: usize) -> Self {
        Self {
            moved_pages: (0..n_regions * stride).map(|_| AtomicU32::new(0)).collect(),
            stride,
            ranges: AtomicUsize::new(0),
            max_ranges,
        }
    }

    /// The share of this host's `vm.max_map_count` new ranges may take.
    pub(crate) fn host_max_ranges() -> usize {
        let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_MAX_MAP_COUNT);
        limit / MAPPINGS_PER_RANGE
    }

    fn entry(&self, region: usize, expert: u32) -> Option<&AtomicU32> {
        if expert as usize >= self.stride {
            return None;
        }
        self.moved_pages.get(region * self.stride + expert as usize)
    }

    /// Whether a move into `expert`'s range of `region` may go ahead: moved
    /// into before, or a new range within the budget. Only the flash actor
    /// moves pages, so this check and [`MapBudget::moved_into`] are not raced.
    pub(crate) fn admit(&self, region: usize, expert: u32) -> bool {
        self.entry(region, expert).is_some_and(|e| {
            e.load(Ordering::Relaxed) > 0 || self.ranges.load(Ordering::Relaxed) < self.max_ranges
        })
    }

    /// A move of `pages` into `expert`'s range of `region` happened.
    pub(crate) fn moved_into(&self, region: usize, expert: u32, pages: usize) {
        debug_assert!(pages > 0);
        let Some(e) = self.entry(region, expert) else {
            return;
        };
        if e.swap(pages as u32, Ordering::Relaxed) == 0 {
            self.ranges.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many of a slot's `inner` pages, from its first, are one mapping:
    /// all of them unless the last move into it covered fewer.
    pub(crate) fn one_mapping_pages(&self, region: usize, expert: u32, inner: usize) -> usize {
        match self
            .entry(region, expert)
            .map(|e| e.load(Ordering::Relaxed))
        {
            Some(0) => inner,
            Some(moved) => inner.min(moved as usize),
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ranges_stop_at_the_budget_and_old_ones_stay_open() {
        let b = MapBudget::new(2, 4, 2);
        assert!(
            b.admit(0, 1) && b.admit(1, 3) && b.admit(0, 2),
            "room for two"
        );
        b.moved_into(0, 1, 3);
        b.moved_into(1, 3, 3);
        assert!(!b.admit(0, 2), "a third is past the budget");
        assert!(b.admit(0, 1) && b.admit(1, 3), "moved into before");
        b.moved_into(0, 1, 2);
        assert!(!b.admit(0, 2), "a move into an old range counts nothing");
        assert!(MapBudget::host_max_ranges() >= 1000);
    }

    #[test]
    fn an_expert_outside_the_arena_is_refused_while_there_is_room() {
        let b = MapBudget::new(2, 4, 100);
        assert!(!b.admit(0, 4), "past the stride, not region 1's expert 0");
        assert!(!b.admit(2, 0), "past the regions");
        assert_eq!(b.one_mapping_pages(0, 4, 3), 0);
        b.moved_into(0, 4, 3);
        assert_eq!(b.one_mapping_pages(1, 0, 3), 3, "region 1 untouched");
        assert!(b.admit(1, 0));
    }

    #[test]
    fn a_partial_move_leaves_only_its_pages_as_one_mapping() {
        let b = MapBudget::new(1, 4, 100);
        assert_eq!(b.one_mapping_pages(0, 0, 3), 3, "the region's own mapping");
        b.moved_into(0, 0, 2);
        assert_eq!(b.one_mapping_pages(0, 0, 3), 2, "two moved, one left");
        b.moved_into(0, 0, 3);
        assert_eq!(b.one_mapping_pages(0, 0, 3), 3, "moved over whole");
    }
}
