//! One (cell, round): the `bmoe run` child with the host sampled around it
//! (and a busy neighbour beside it when the self-test asks), judged against
//! the baseline's text, with its progress line.

use std::path::Path;

use super::child::run_child;
use super::env::BenchEnv;
use super::host;
use super::neighbour::Neighbour;
use super::{error::BenchError, summary::RunResult};
use crate::lab::compare::{self, RunCsv};

/// Run one (cell, round) and judge it: the failure (if any), the CSV, whether
/// its text equals the baseline's, the host's conditions while it ran; returns
/// it with its progress line. With `neighbour`, a busy neighbour thread runs
/// beside it (its CPU time taken out of the bench's own, so it counts as
/// another's).
pub(super) fn run_cell(
    env: &BenchEnv,
    ci: usize,
    run: u32,
    stem: &Path,
    neighbour: bool,
    baseline_text: &mut Option<Vec<u8>>,
) -> Result<(RunResult, String), BenchError> {
    let plan = env.plan;
    let busy = match neighbour {
        true => Some(Neighbour::start()?),
        false => None,
    };
    let sample = || {
        let s = host::sample(env.device);
        match &busy {
            Some(n) => n.not_own(s),
            None => s,
        }
    };
    let before = sample();
    let args = &plan.cells[ci].args;
    let (res, speeds) = host::with_speed_samples(|| {
        run_child(plan, args, &env.prompt_path, plan.workload.tokens, stem)
    });
    let (mut failure, wall_s) = res?;
    let after = sample();
    drop(busy);
    let csv_path = stem.with_extension("csv");
    let csv = match RunCsv::open(&csv_path) {
        Ok(c) => Some(c),
        Err(e) => {
            failure.get_or_insert_with(|| e.to_string());
            None
        }
    };
    if let (None, Some(c)) = (&failure, &csv) {
        if c.aborted() {
            failure = Some("the run was interrupted (aborted=1 in its CSV)".into());
        }
    }
    let text = std::fs::read(stem.with_extension("out")).ok();
    if ci == 0 && baseline_text.is_none() && failure.is_none() {
        *baseline_text = text.clone();
    }
    let same_text_as_baseline = match (&*baseline_text, &text, &failure) {
        (Some(b), Some(t), None) => Some(b == t),
        _ => None,
    };
    let line = progress_line(failure.as_deref(), csv.as_ref());
    let result = RunResult {
        cell: ci,
        run,
        csv_path,
        csv,
        failure,
        same_text_as_baseline,
        wall_s,
        conditions: Some(speeds.onto(host::conditions(&before, &after))),
        flags: Vec::new(),
        probe_set: env.probe.cell_sets.get(ci).copied().unwrap_or(0),
    };
    Ok((result, line))
}

/// A run's figures (or why there are none) for its progress line.
fn progress_line(failure: Option<&str>, csv: Option<&RunCsv>) -> String {
    match (failure, csv.map(compare::figures)) {
        (Some(f), _) => format!("FAILED: {f}"),
        (None, Some(Ok(f))) => format!(
            "{:.2} tok/s [{:.2}-{:.2}], {:.2} MiB/token, hit {}, stall {:.3} s/token",
            f.rate.tok_s,
            f.rate.lo,
            f.rate.hi,
            f.mib_per_token,
            f.hit_pct
                .map(|h| format!("{h:.1}%"))
                .unwrap_or_else(|| "-".into()),
            f.stall_ms_per_token / 1e3
        ),
        (None, Some(Err(e))) => format!("unreadable CSV: {e}"),
        (None, None) => "no CSV".into(),
    }
}
