//! How many slot ranges the arena may move pages into. Each move into a slot
//! (a recycled slot's pages, a toucher's cell) makes that range a mapping of
//! its own, splitting the region around it, and the split stays after the
//! slot is released: the process's mapping count grows with the distinct
//! ranges ever moved into, up to the kernel's `vm.max_map_count` (65,530 by
//! default), past which any `mmap` (an allocation) fails. Past a share of it,
//! a new range is read into its own pages (faults) instead; ranges moved into
//! before stay free to move into again (the move replaces their mapping).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings one new moved-into range may cost at most (its split, and the
/// source's), as a divisor of the kernel's limit: the rest of the process
/// keeps at least a third of it. (Measured: 5,732 mappings after 3,500 moves.)
const MAPPINGS_PER_RANGE: usize = 6;

/// The kernel's default `vm.max_map_count`.
const DEFAULT_MAX_MAP_COUNT: usize = 65_530;

/// Per (region, expert): moved into before; and how many such ranges.
#[derive(Debug)]
pub(crate) struct MapBudget {
    moved: Vec<AtomicBool>,
    stride: usize,
    ranges: AtomicUsize,
    max_ranges: usize,
}

impl MapBudget {
    /// `n_regions` regions of at most `stride` experts, at most `max_ranges`
    /// distinct ranges moved into.
    pub(crate) fn new(n_regions: usize, stride: usize, max_ranges: usize) -> Self {
        Self {
            moved: (0..n_regions * stride)
                .map(|_| AtomicBool::new(false))
                .collect(),
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

    /// Whether a move into `expert`'s range of `region` may go ahead: moved
    /// into before, or a new range within the budget (then counted). Only the
    /// flash actor moves pages, so the check and the count are not raced.
    pub(crate) fn admit(&self, region: usize, expert: u32) -> bool {
        let Some(flag) = self.moved.get(region * self.stride + expert as usize) else {
            return false;
        };
        if flag.load(Ordering::Relaxed) {
            return true;
        }
        if self.ranges.load(Ordering::Relaxed) >= self.max_ranges {
            return false;
        }
        flag.store(true, Ordering::Relaxed);
        self.ranges.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ranges_stop_at_the_budget_and_old_ones_stay_open() {
        let b = MapBudget::new(2, 4, 2);
        assert!(b.admit(0, 1) && b.admit(1, 3), "two new ranges");
        assert!(!b.admit(0, 2), "a third is past the budget");
        assert!(b.admit(0, 1) && b.admit(1, 3), "moved into before");
        assert!(!b.admit(2, 0) && !b.admit(0, 4), "outside the arena");
        assert!(MapBudget::host_max_ranges() >= 1000);
    }
}
