//! The bench summary's figures: each run's result, each cell's runs pooled
//! into figures, and a cell's ratio to the baseline paired by round. The
//! tables of `summary.md` are in [`super::tables`].

use std::path::PathBuf;

use super::bound::{of_round, RoundProbe};
use super::host::Conditions;
use super::ratio::{paired_ratio, PairedRatio};
use super::{cells::Cell, error::BenchError};
use crate::lab::compare::{self, RunCsv, RunFigures};

const MIB: f64 = 1024.0 * 1024.0;

/// One finished (or failed) run of a cell.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub(crate) cell: usize,
    pub(crate) run: u32,
    pub(crate) csv_path: PathBuf,
    /// The parsed CSV, when the run wrote a complete one.
    pub(crate) csv: Option<RunCsv>,
    /// Why the run failed (exit status and the last stderr line), if it did.
    pub(crate) failure: Option<String>,
    /// Whether its text equals the baseline's first run's text.
    pub(crate) same_text_as_baseline: Option<bool>,
    pub(crate) wall_s: f64,
    /// The host while it ran (None: not sampled).
    pub(crate) conditions: Option<Conditions>,
    /// Why its conditions differ from its reference's (empty: not flagged).
    pub(crate) flags: Vec<String>,
    /// The probe set whose bandwidth bounds it (the slices its cache misses on).
    pub(crate) probe_set: usize,
}

impl RunResult {
    /// The run's figures, when it succeeded with a readable CSV.
    fn figures(&self) -> Option<RunFigures> {
        match (&self.failure, &self.csv) {
            (None, Some(c)) => compare::figures(c).ok(),
            _ => None,
        }
    }

    /// The run's tok/s over its own round's overlap bound (None: no bound or
    /// no figures).
    pub(crate) fn of_bound(&self, probes: &[RoundProbe]) -> Option<f64> {
        let f = self.figures()?;
        let bound = self.bounds(probes, &f)?.overlap_tok_s;
        (bound > 0.0).then(|| f.rate.tok_s / bound)
    }

    /// Its own round's bounds at the bytes it read a token.
    fn bounds(&self, probes: &[RoundProbe], f: &RunFigures) -> Option<RunBounds> {
        let depth = self
            .csv
            .as_ref()?
            .preamble
            .get("io_threads")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let b = &of_round(probes, self.run)?.bound;
        let bytes = f.mib_per_token * MIB;
        Some(RunBounds {
            read_tok_s: b.read_tok_s(self.probe_set, depth, bytes),
            compute_tok_s: b.resident_tok_s,
            overlap_tok_s: b.tok_s(self.probe_set, depth, bytes),
        })
    }
}

/// A run's bounds, tok/s: its bytes a token at the round's probed bandwidth
/// (None: it read nothing, or its slices had no probe), the round's resident
/// decode, and the slower of the two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RunBounds {
    pub(crate) read_tok_s: Option<f64>,
    pub(crate) compute_tok_s: f64,
    pub(crate) overlap_tok_s: f64,
}

impl RunBounds {
    /// The mean of each bound over `runs` (None without any).
    fn mean(runs: &[RunBounds]) -> Option<RunBounds> {
        let compute = mean_of(runs.iter().map(|b| b.compute_tok_s))?;
        Some(RunBounds {
            read_tok_s: mean_of(runs.iter().filter_map(|b| b.read_tok_s)),
            compute_tok_s: compute,
            overlap_tok_s: mean_of(runs.iter().map(|b| b.overlap_tok_s))?,
        })
    }
}

/// The paired ratio of cell `ci` to the baseline (cell 0) over the rounds in
/// which both ran successfully; with `unflagged_only`, over the rounds in
/// which neither was flagged.
pub(crate) fn cell_ratio(
    results: &[RunResult],
    ci: usize,
    unflagged_only: bool,
) -> Option<PairedRatio> {
    let rates = |cell: usize| -> Vec<(u32, f64)> {
        results
            .iter()
            .filter(|r| r.cell == cell && (!unflagged_only || r.flags.is_empty()))
            .filter_map(|r| Some((r.run, r.figures()?.rate.tok_s)))
            .collect()
    };
    paired_ratio(&rates(ci), &rates(0))
}

/// Per-cell figures pooled over its runs.
#[derive(Debug, Clone)]
pub struct CellSummary {
    pub(crate) name: String,
    pub(crate) runs: usize,
    pub(crate) failed: usize,
    pub(crate) per_run_tok_s: Vec<f64>,
    pub(crate) mean_tok_s: f64,
    /// Bootstrap 95% interval: runs resampled, then tokens within them
    /// ([`compare::rate_with_ci_runs`]); between-run drift is in it from 2 runs on.
    pub(crate) ci: (f64, f64),
    pub(crate) effective_tok_s: f64,
    pub(crate) reads: CellReads,
    pub(crate) spec: CellSpec,
    pub(crate) peak_rss_mib: Option<f64>,
    pub(crate) resident: bool,
    pub(crate) lossy: bool,
    /// Its runs' bounds (None: no run had a probe and figures).
    pub(crate) bound: Option<CellBound>,
    pub(crate) same_text: Option<bool>,
    pub(crate) prefill: CellPrefill,
}

/// A cell's decode reads, means over its runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CellReads {
    pub(crate) mib_per_token: f64,
    pub(crate) hit_pct: Option<f64>,
    pub(crate) stall_s_per_token: f64,
    pub(crate) majflt_per_token: f64,
}

/// A speculating cell's figures (None for a cell that does not draft).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CellSpec {
    pub(crate) acceptance_pct: Option<f64>,
    pub(crate) tokens_per_verify: Option<f64>,
    /// "D of V" drafted steps of verify decodes, its first run's.
    pub(crate) drafted_steps: Option<String>,
}

/// The prompt's pass: mean seconds, and (streamed) bytes read over the
/// distinct routed slices (1.0 is the floor).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CellPrefill {
    pub(crate) s: Option<f64>,
    pub(crate) read_multiple: Option<f64>,
}

/// A cell's bounds: the mean over its runs of each run's own round's, and
/// the mean of each run's tok/s over its overlap bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CellBound {
    pub(crate) tok_s: RunBounds,
    pub(crate) reached: Option<f64>,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The mean of `v` (None when empty).
pub(super) fn mean_of(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| mean(&v))
}

pub(super) fn trailer_f64(csv: &RunCsv, key: &str) -> Option<f64> {
    csv.trailer.get(key).and_then(|v| v.parse::<f64>().ok())
}

/// A run that succeeded: its result, CSV and figures.
type OkRun<'a> = (&'a RunResult, &'a RunCsv, RunFigures);

/// Pool the runs of each cell.
pub(crate) fn summarize(
    cells: &[Cell],
    results: &[RunResult],
    probes: &[RoundProbe],
) -> Result<Vec<CellSummary>, BenchError> {
    cells
        .iter()
        .enumerate()
        .map(|(ci, cell)| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.cell == ci).collect();
            let ok = ok_runs(&runs)?;
            Ok(summarize_cell(cell, runs.len(), &ok, probes))
        })
        .collect()
}

/// The runs of `runs` that succeeded with a CSV, with their figures.
fn ok_runs<'a>(runs: &[&'a RunResult]) -> Result<Vec<OkRun<'a>>, BenchError> {
    Ok(runs
        .iter()
        .filter(|r| r.failure.is_none())
        .filter_map(|r| r.csv.as_ref().map(|c| (*r, c)))
        .map(|(r, c)| compare::figures(c).map(|f| (r, c, f)))
        .collect::<Result<_, _>>()?)
}

/// The bootstrap 95% interval of the rate over the runs' per-token series
/// ((0, 0) without any).
fn rate_ci(ok: &[OkRun]) -> (f64, f64) {
    let series: Vec<Vec<f64>> = ok
        .iter()
        .map(|(_, c, _)| c.decode_series("wall_ms"))
        .collect();
    compare::rate_with_ci_runs(&series, compare::BOOTSTRAP_RESAMPLES, 0.95, 0x05ee_db0b)
        .map(|r| (r.lo, r.hi))
        .unwrap_or((0.0, 0.0))
}

/// Speculated runs only: emitted decode tokens per target decode over all of
/// them, and the first run's `drafted steps of decodes` (when it speculated).
fn spec_figures(ok: &[OkRun]) -> (Option<f64>, Option<String>) {
    let spec_runs: Vec<&RunCsv> = ok
        .iter()
        .map(|x| x.1)
        .filter(|c| c.spec() != "off")
        .collect();
    let decodes: f64 = spec_runs
        .iter()
        .filter_map(|c| trailer_f64(c, "mtp_decodes"))
        .sum();
    let tokens_per_verify = (decodes > 0.0).then(|| {
        spec_runs
            .iter()
            .map(|c| c.decode_series("wall_ms").len() as f64)
            .sum::<f64>()
            / decodes
    });
    let first = ok.first().map(|x| x.1).filter(|c| c.spec() != "off");
    let drafted_steps = first.and_then(|c| {
        Some(format!(
            "{} of {}",
            c.trailer.get("drafted_steps")?,
            c.trailer.get("mtp_decodes")?
        ))
    });
    (tokens_per_verify, drafted_steps)
}

/// One cell's figures over its `n_runs` runs, of which `ok` succeeded.
fn summarize_cell(cell: &Cell, n_runs: usize, ok: &[OkRun], probes: &[RoundProbe]) -> CellSummary {
    let per_run: Vec<f64> = ok.iter().map(|(_, _, f)| f.rate.tok_s).collect();
    let avg = |f: fn(&RunFigures) -> f64| mean(&ok.iter().map(|x| f(&x.2)).collect::<Vec<_>>());
    let opt_avg = |f: fn(&RunFigures) -> Option<f64>| mean_of(ok.iter().filter_map(|x| f(&x.2)));
    let trailer_mean = |key: &str| mean_of(ok.iter().filter_map(|x| trailer_f64(x.1, key)));
    let first = ok.first().map(|x| x.1);
    let (tokens_per_verify, drafted_steps) = spec_figures(ok);
    let texts: Vec<bool> = ok
        .iter()
        .filter_map(|x| x.0.same_text_as_baseline)
        .collect();
    CellSummary {
        name: cell.name.clone(),
        runs: n_runs,
        failed: n_runs - ok.len(),
        mean_tok_s: mean(&per_run),
        per_run_tok_s: per_run,
        ci: rate_ci(ok),
        effective_tok_s: avg(|f| f.effective_tok_s),
        reads: CellReads {
            mib_per_token: avg(|f| f.mib_per_token),
            hit_pct: opt_avg(|f| f.hit_pct),
            stall_s_per_token: avg(|f| f.stall_ms_per_token) / 1e3,
            majflt_per_token: avg(|f| f.majflt_per_token),
        },
        spec: CellSpec {
            acceptance_pct: opt_avg(|f| f.acceptance_pct),
            tokens_per_verify,
            drafted_steps,
        },
        peak_rss_mib: ok
            .iter()
            .filter_map(|x| trailer_f64(x.1, "peak_rss_bytes"))
            .map(|b| b / MIB)
            .reduce(f64::max),
        resident: first
            .and_then(|c| c.preamble.get("mode"))
            .map(String::as_str)
            == Some("resident"),
        lossy: first.is_some_and(|c| c.lossy()),
        bound: cell_bound(ok, probes),
        same_text: (!texts.is_empty()).then(|| texts.iter().all(|t| *t)),
        prefill: CellPrefill {
            s: trailer_mean("prefill_s"),
            read_multiple: trailer_mean("prefill_read_multiple"),
        },
    }
}

/// The bounds of a cell's successful runs.
fn cell_bound(ok: &[OkRun], probes: &[RoundProbe]) -> Option<CellBound> {
    let each: Vec<RunBounds> = ok.iter().filter_map(|x| x.0.bounds(probes, &x.2)).collect();
    Some(CellBound {
        tok_s: RunBounds::mean(&each)?,
        reached: mean_of(ok.iter().filter_map(|x| x.0.of_bound(probes))),
    })
}
