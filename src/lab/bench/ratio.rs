//! A cell's rate as a ratio to the baseline's, paired by round: in each round
//! the cell's run is divided by the baseline's run of the same round (both ran
//! minutes apart, so the host's drift between rounds cancels), and the 95%
//! interval is Student's t over the rounds' log ratios.

/// The paired ratio of one cell to the baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PairedRatio {
    /// Rounds with both runs.
    pub(crate) n: usize,
    /// Geometric mean of the rounds' ratios.
    pub(crate) ratio: f64,
    /// 95% interval (None with a single round).
    pub(crate) ci: Option<(f64, f64)>,
}

impl PairedRatio {
    /// The interval's width relative to the ratio, (hi − lo) / ratio (None
    /// with a single round): 0.1 is about ±5%.
    pub(crate) fn width(&self) -> Option<f64> {
        self.ci.map(|(lo, hi)| (hi - lo) / self.ratio)
    }
}

/// Student's t at 97.5% for `df` degrees of freedom (df ≥ 1).
pub(crate) fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96,
    }
}

/// The paired ratio from per-round rates of the cell and of the baseline,
/// each as (round, tok/s); rounds missing on either side are skipped.
pub(crate) fn paired_ratio(cell: &[(u32, f64)], baseline: &[(u32, f64)]) -> Option<PairedRatio> {
    let logs: Vec<f64> = cell
        .iter()
        .filter_map(|&(r, c)| {
            let b = baseline.iter().find(|x| x.0 == r)?.1;
            (c > 0.0 && b > 0.0).then(|| (c / b).ln())
        })
        .collect();
    let n = logs.len();
    if n == 0 {
        return None;
    }
    let mean = logs.iter().sum::<f64>() / n as f64;
    let ci = (n >= 2).then(|| {
        let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_975(n - 1) * (var / n as f64).sqrt();
        ((mean - half).exp(), (mean + half).exp())
    });
    Some(PairedRatio {
        n,
        ratio: mean.exp(),
        ci,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_cancels_the_drift_between_rounds() {
        // The host slows by half in round 2; the cell is 2x the baseline in both.
        let base = [(1, 10.0), (2, 5.0), (3, 10.0)];
        let cell = [(1, 20.0), (2, 10.0)];
        let r = paired_ratio(&cell, &base).unwrap();
        assert_eq!(r.n, 2);
        assert!((r.ratio - 2.0).abs() < 1e-12);
        let (lo, hi) = r.ci.unwrap();
        assert!((lo - 2.0).abs() < 1e-9 && (hi - 2.0).abs() < 1e-9);
        assert!(r.width().unwrap() < 1e-9);
    }

    #[test]
    fn the_interval_is_students_t_over_log_ratios() {
        let base = [(1, 1.0), (2, 1.0), (3, 1.0)];
        let cell = [(1, 1.0), (2, 1.1), (3, 1.2)];
        let r = paired_ratio(&cell, &base).unwrap();
        let logs = [0.0f64, 1.1f64.ln(), 1.2f64.ln()];
        let m = logs.iter().sum::<f64>() / 3.0;
        let sd = (logs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 2.0).sqrt();
        let half = 4.303 * sd / 3f64.sqrt();
        let (lo, hi) = r.ci.unwrap();
        assert!((lo - (m - half).exp()).abs() < 1e-12);
        assert!((hi - (m + half).exp()).abs() < 1e-12);
        assert!(lo < r.ratio && r.ratio < hi);
        // One round has no interval and is never "narrow".
        let one = paired_ratio(&cell[..1], &base).unwrap();
        assert_eq!(one.ci, None);
        assert_eq!(one.width(), None);
        assert_eq!(paired_ratio(&[(9, 1.0)], &base), None);
        assert_eq!(t_975(0), f64::INFINITY);
        assert_eq!(t_975(100), 1.96);
    }
}
