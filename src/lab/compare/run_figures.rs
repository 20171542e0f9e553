//! One run's figures (rate, traffic, hit rate, stalls, acceptance) and the
//! preamble keys that tell runs apart.

use std::collections::BTreeSet;

use super::{bootstrap::rate_with_ci, bootstrap::RateCi, csv::RunCsv, error::CompareError};

/// One row of the comparison table.
#[derive(Debug, Clone)]
pub struct RunFigures {
    pub(crate) decodes: usize,
    pub rate: RateCi,
    /// Emitted tokens over all time spent (decode + drafting); = rate for plain runs.
    pub effective_tok_s: f64,
    pub(crate) mib_per_token: f64,
    pub(crate) hit_pct: Option<f64>,
    pub(crate) stall_ms_per_token: f64,
    pub(crate) majflt_per_token: f64,
    pub(crate) acceptance_pct: Option<f64>,
}

pub const BOOTSTRAP_RESAMPLES: usize = 2000;
const BOOTSTRAP_SEED: u64 = 0xb007_57a9;

pub fn figures(run: &RunCsv) -> Result<RunFigures, CompareError> {
    let wall = run.decode_series("wall_ms");
    let rate = rate_with_ci(&wall, BOOTSTRAP_RESAMPLES, 0.95, BOOTSTRAP_SEED).ok_or_else(|| {
        CompareError::Empty {
            path: run.path.clone(),
        }
    })?;
    let n = wall.len() as f64;
    let sum = |c: &str| run.decode_series(c).iter().sum::<f64>();
    let hits = sum("cache_hits");
    let misses = sum("cache_misses");
    let draft_ms = sum("mtp_draft_ms");
    let total_ms: f64 = wall.iter().sum::<f64>() + draft_ms;
    let acceptance_pct = match (
        run.trailer
            .get("mtp_drafted")
            .and_then(|v| v.parse::<f64>().ok()),
        run.trailer
            .get("mtp_accepted")
            .and_then(|v| v.parse::<f64>().ok()),
    ) {
        (Some(d), Some(a)) if d > 0.0 => Some(a * 100.0 / d),
        _ => None,
    };
    Ok(RunFigures {
        decodes: wall.len(),
        rate,
        effective_tok_s: n * 1000.0 / total_ms,
        mib_per_token: sum("read_bytes") / n / (1024.0 * 1024.0),
        hit_pct: (hits + misses > 0.0).then(|| hits * 100.0 / (hits + misses)),
        stall_ms_per_token: sum("stall_ms") / n,
        majflt_per_token: sum("majflt") / n,
        acceptance_pct,
    })
}

/// Preamble keys whose values differ between the runs (the table's legend).
pub fn differing_keys(runs: &[RunCsv]) -> Vec<String> {
    let keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.preamble.keys()).collect();
    keys.into_iter()
        .filter(|k| {
            let vals: BTreeSet<Option<&String>> = runs.iter().map(|r| r.preamble.get(*k)).collect();
            vals.len() > 1
        })
        .cloned()
        .collect()
}
