//! The decode rate with a percentile bootstrap interval, over one run's
//! per-token times or over several runs of one configuration.

/// Decode rate and its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateCi {
    pub tok_s: f64,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
}

/// SplitMix64: a fixed-seed stream for the bootstrap (reproducible tables).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// tokens / seconds over per-token wall times, with a percentile bootstrap
/// interval (`resamples` draws with replacement, `level` e.g. 0.95, fixed seed).
pub(crate) fn rate_with_ci(
    wall_ms: &[f64],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Option<RateCi> {
    let n = wall_ms.len();
    let total: f64 = wall_ms.iter().sum();
    if n == 0 || total <= 0.0 {
        return None;
    }
    let rate = |sum_ms: f64| n as f64 * 1000.0 / sum_ms;
    let mut rng = SplitMix(seed);
    let draws: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let s: f64 = (0..n)
                .map(|_| wall_ms[(rng.next() % n as u64) as usize])
                .sum();
            rate(s)
        })
        .collect();
    Some(interval(rate(total), draws, level))
}

/// The point estimate with the `level` percentile interval of the bootstrap `draws`.
fn interval(tok_s: f64, mut draws: Vec<f64>, level: f64) -> RateCi {
    draws.sort_by(f64::total_cmp);
    let q = |p: f64| draws[((p * (draws.len() - 1) as f64).round() as usize).min(draws.len() - 1)];
    let tail = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    RateCi {
        tok_s,
        lo: q(tail),
        hi: q(1.0 - tail),
    }
}

/// The decode rate of several runs of one configuration, with a two-level
/// (hierarchical) percentile bootstrap: each draw picks runs with replacement,
/// then per-token times within each picked run. With two or more runs the
/// interval covers the drift between runs (a shared host's state changes from
/// one run to the next), not only the token-to-token noise within one; with a
/// single run it is [`rate_with_ci`]. The point estimate is the pooled rate.
pub(crate) fn rate_with_ci_runs(
    runs: &[Vec<f64>],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Option<RateCi> {
    let runs: Vec<&Vec<f64>> = runs.iter().filter(|r| !r.is_empty()).collect();
    match runs.len() {
        0 => return None,
        1 => return rate_with_ci(runs[0], resamples, level, seed),
        _ => {}
    }
    let n: usize = runs.iter().map(|r| r.len()).sum();
    let total: f64 = runs.iter().flat_map(|r| r.iter()).sum();
    if total <= 0.0 {
        return None;
    }
    let mut rng = SplitMix(seed);
    let draws: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let (mut count, mut sum) = (0usize, 0.0f64);
            for _ in 0..runs.len() {
                let r = runs[(rng.next() % runs.len() as u64) as usize];
                for _ in 0..r.len() {
                    sum += r[(rng.next() % r.len() as u64) as usize];
                }
                count += r.len();
            }
            count as f64 * 1000.0 / sum
        })
        .collect();
    Some(interval(n as f64 * 1000.0 / total, draws, level))
}
