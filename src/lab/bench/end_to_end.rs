//! What a user sees: each run's end-to-end decode rate (`decode_tok_s` of its
//! CSV trailer: tokens after the first over the wall time from the first to
//! the last, drafting, sampling, output and telemetry included), per cell and
//! as a ratio to the baseline paired by round. The cells table's tok/s counts
//! the decodes alone, which leaves out what speculation adds between them (a
//! head's drafting and catch-up, the gate's bookkeeping).

use std::fmt::Write as _;

use super::cells::Cell;
use super::ratio::paired_ratio;
use super::summary::{trailer_f64, RunResult};

/// The run's end-to-end decode rate, when it succeeded with a readable CSV.
fn end_to_end_tok_s(r: &RunResult) -> Option<f64> {
    trailer(r, "decode_tok_s").filter(|&t| t > 0.0)
}

/// The share of the run's decode phase spent outside the decodes (1 − the
/// end-to-end rate over the decodes-alone rate).
fn outside_share(r: &RunResult) -> Option<f64> {
    let compute = trailer(r, "decode_compute_tok_s").filter(|&t| t > 0.0)?;
    Some(1.0 - end_to_end_tok_s(r)? / compute)
}

/// A trailer value of a run that succeeded with a readable CSV.
fn trailer(r: &RunResult, key: &str) -> Option<f64> {
    match (&r.failure, &r.csv) {
        (None, Some(c)) => trailer_f64(c, key),
        _ => None,
    }
}

/// The mean of `shares` as a percentage ("—" when there are none).
fn mean_pct(shares: impl Iterator<Item = f64>) -> String {
    let v: Vec<f64> = shares.collect();
    match v.is_empty() {
        true => "—".to_string(),
        false => format!("{:.1}%", 100.0 * v.iter().sum::<f64>() / v.len() as f64),
    }
}

/// The markdown table: per cell its runs' end-to-end rates (round order), the
/// mean, the mean share of time outside the decodes, and the paired ratio to
/// the baseline over all runs with its 95% interval.
pub(crate) fn end_to_end_table(cells: &[Cell], results: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| cell | runs | end-to-end tok/s | per run | outside decodes | x baseline (rounds) | 95% CI |"
    );
    let _ = writeln!(out, "|---|---:|---:|---|---:|---:|---|");
    let rates = |cell: usize| -> Vec<(u32, f64)> {
        let mut v: Vec<(u32, f64)> = results
            .iter()
            .filter(|r| r.cell == cell)
            .filter_map(|r| Some((r.run, end_to_end_tok_s(r)?)))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    };
    let baseline = rates(0);
    for (ci, c) in cells.iter().enumerate() {
        let own = rates(ci);
        let per_run: Vec<String> = own.iter().map(|x| format!("{:.2}", x.1)).collect();
        let mean = own.iter().map(|x| x.1).sum::<f64>() / own.len().max(1) as f64;
        let outside = mean_pct(
            results
                .iter()
                .filter(|r| r.cell == ci)
                .filter_map(outside_share),
        );
        let (ratio, ci95) = match (ci, paired_ratio(&own, &baseline)) {
            (0, _) => ("1 (baseline)".to_string(), "—".to_string()),
            (_, None) => ("—".into(), "—".into()),
            (_, Some(r)) => (
                format!("{:.3}x ({})", r.ratio, r.n),
                r.ci.map_or_else(|| "—".into(), |(lo, hi)| format!("{lo:.3}–{hi:.3}")),
            ),
        };
        let name = match ci {
            0 => format!("{} (baseline)", c.name),
            _ => c.name.clone(),
        };
        let _ = writeln!(
            out,
            "| {name} | {} | {mean:.2} | {} | {outside} | {ratio} | {ci95} |",
            own.len(),
            per_run.join(" / ")
        );
    }
    out
}
