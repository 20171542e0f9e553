//! The run order of a bench: interleaved rounds, the baseline once more.

/// The run order: `repeats` rounds, each visiting every cell in order
/// (A B C A B C, never A A B B), then the baseline (cell 0) once more, so the
/// baseline has at least two runs spread over the whole matrix.
/// Items are (cell index, run number of that cell, from 1).
pub fn schedule(n_cells: usize, repeats: u32) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    if n_cells == 0 {
        return out;
    }
    for r in 1..=repeats.max(1) {
        for c in 0..n_cells {
            out.push((c, r));
        }
    }
    out.push((0, repeats.max(1) + 1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_interleaves_and_repeats_the_baseline() {
        assert_eq!(
            schedule(3, 2),
            vec![(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)]
        );
        assert_eq!(schedule(1, 1), vec![(0, 1), (0, 2)]);
        assert_eq!(schedule(2, 0), vec![(0, 1), (1, 1), (0, 2)]);
        assert!(schedule(0, 3).is_empty());
    }
}
