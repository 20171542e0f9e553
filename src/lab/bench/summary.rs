//! The bench summary: each cell's runs pooled into figures, and the markdown
//! tables (cells, probe bound, legend) of `summary.md`.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::bound::{of_round, RoundProbe};
use super::host::Conditions;
use super::ratio::{paired_ratio, PairedRatio};
use super::traced::ProbeSlices;
use super::{BenchError, Cell};
use crate::lab::compare::{self, RunCsv, RunFigures};

const MIB: f64 = 1024.0 * 1024.0;

/// One finished (or failed) run of a cell.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub cell: usize,
    pub run: u32,
    pub csv_path: PathBuf,
    /// The parsed CSV, when the run wrote a complete one.
    pub csv: Option<RunCsv>,
    /// Why the run failed (exit status and the last stderr line), if it did.
    pub failure: Option<String>,
    /// Whether its text equals the baseline's first run's text.
    pub same_text_as_baseline: Option<bool>,
    pub wall_s: f64,
    /// The host while it ran (None: not sampled).
    pub conditions: Option<Conditions>,
    /// Why its conditions differ from its reference's (empty: not flagged).
    pub flags: Vec<String>,
    /// The probe set whose bandwidth bounds it (the slices its cache misses on).
    pub probe_set: usize,
}

impl RunResult {
    /// The run's figures, when it succeeded with a readable CSV.
    fn figures(&self) -> Option<RunFigures> {
        match (&self.failure, &self.csv) {
            (None, Some(c)) => compare::figures(c).ok(),
            _ => None,
        }
    }

    /// The run's tok/s over its own round's bound (None: no bound or no figures).
    pub fn of_bound(&self, probes: &[RoundProbe]) -> Option<f64> {
        let f = self.figures()?;
        let bound = self.bound_tok_s(probes, &f)?;
        (bound > 0.0).then(|| f.rate.tok_s / bound)
    }

    fn bound_tok_s(&self, probes: &[RoundProbe], f: &RunFigures) -> Option<f64> {
        let depth = self
            .csv
            .as_ref()?
            .preamble
            .get("io_threads")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let p = of_round(probes, self.run)?;
        Some(p.bound.tok_s(self.probe_set, depth, f.mib_per_token * MIB))
    }
}

/// The paired ratio of cell `ci` to the baseline (cell 0) over the rounds in
/// which both ran successfully; with `unflagged_only`, over the rounds in
/// which neither was flagged.
pub fn cell_ratio(results: &[RunResult], ci: usize, unflagged_only: bool) -> Option<PairedRatio> {
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
    pub name: String,
    pub runs: usize,
    pub failed: usize,
    pub per_run_tok_s: Vec<f64>,
    pub mean_tok_s: f64,
    /// Bootstrap 95% interval: runs resampled, then tokens within them
    /// ([`compare::rate_with_ci_runs`]); between-run drift is in it from 2 runs on.
    pub ci: (f64, f64),
    pub effective_tok_s: f64,
    pub mib_per_token: f64,
    pub hit_pct: Option<f64>,
    pub stall_s_per_token: f64,
    pub majflt_per_token: f64,
    pub acceptance_pct: Option<f64>,
    pub tokens_per_verify: Option<f64>,
    pub drafted_steps: Option<String>,
    pub peak_rss_mib: Option<f64>,
    pub resident: bool,
    pub lossy: bool,
    /// Mean over the runs of the bound of each run's own round.
    pub bound_tok_s: Option<f64>,
    /// Mean over the runs of tok/s over that bound.
    pub of_bound: Option<f64>,
    pub same_text: Option<bool>,
    /// The prompt's pass: mean seconds, and (streamed) bytes read over the
    /// distinct routed slices (1.0 is the floor).
    pub prefill_s: Option<f64>,
    pub prefill_read_multiple: Option<f64>,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The mean of `v` (None when empty).
fn mean_of(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| mean(&v))
}

pub(super) fn trailer_f64(csv: &RunCsv, key: &str) -> Option<f64> {
    csv.trailer.get(key).and_then(|v| v.parse::<f64>().ok())
}

/// Pool the runs of each cell.
pub fn summarize(
    cells: &[Cell],
    results: &[RunResult],
    probes: &[RoundProbe],
) -> Result<Vec<CellSummary>, BenchError> {
    let mut out = Vec::new();
    for (ci, cell) in cells.iter().enumerate() {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.cell == ci).collect();
        let ok: Vec<(&RunResult, &RunCsv, RunFigures)> = runs
            .iter()
            .filter(|r| r.failure.is_none())
            .filter_map(|r| r.csv.as_ref().map(|c| (*r, c)))
            .map(|(r, c)| compare::figures(c).map(|f| (r, c, f)))
            .collect::<Result<_, _>>()?;
        let per_run: Vec<f64> = ok.iter().map(|(_, _, f)| f.rate.tok_s).collect();
        let series: Vec<Vec<f64>> = ok
            .iter()
            .map(|(_, c, _)| c.decode_series("wall_ms"))
            .collect();
        let ci95 =
            compare::rate_with_ci_runs(&series, compare::BOOTSTRAP_RESAMPLES, 0.95, 0x05ee_db0b)
                .map(|r| (r.lo, r.hi))
                .unwrap_or((0.0, 0.0));
        let avg = |f: fn(&RunFigures) -> f64| mean(&ok.iter().map(|x| f(&x.2)).collect::<Vec<_>>());
        let opt_avg =
            |f: fn(&RunFigures) -> Option<f64>| mean_of(ok.iter().filter_map(|x| f(&x.2)));
        let first = ok.first().map(|x| x.1);
        let pre = |k: &str| first.and_then(|c| c.preamble.get(k).cloned());
        let resident = pre("mode").as_deref() == Some("resident");
        let mib_per_token = avg(|f| f.mib_per_token);
        // Speculated runs only: emitted decode tokens per target decode.
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
        let drafted_steps = first.filter(|c| c.spec() != "off").and_then(|c| {
            Some(format!(
                "{} of {}",
                c.trailer.get("drafted_steps")?,
                c.trailer.get("mtp_decodes")?
            ))
        });
        let rss: Vec<f64> = ok
            .iter()
            .filter_map(|x| trailer_f64(x.1, "peak_rss_bytes"))
            .map(|b| b / (1024.0 * 1024.0))
            .collect();
        let trailer_mean = |key: &str| mean_of(ok.iter().filter_map(|x| trailer_f64(x.1, key)));
        let texts: Vec<bool> = ok
            .iter()
            .filter_map(|x| x.0.same_text_as_baseline)
            .collect();
        out.push(CellSummary {
            name: cell.name.clone(),
            runs: runs.len(),
            failed: runs.len() - ok.len(),
            mean_tok_s: mean(&per_run),
            per_run_tok_s: per_run,
            ci: ci95,
            effective_tok_s: avg(|f| f.effective_tok_s),
            mib_per_token,
            hit_pct: opt_avg(|f| f.hit_pct),
            stall_s_per_token: avg(|f| f.stall_ms_per_token) / 1e3,
            majflt_per_token: avg(|f| f.majflt_per_token),
            acceptance_pct: opt_avg(|f| f.acceptance_pct),
            tokens_per_verify,
            drafted_steps,
            peak_rss_mib: rss.iter().cloned().reduce(f64::max),
            resident,
            lossy: first.is_some_and(|c| c.lossy()),
            bound_tok_s: mean_of(ok.iter().filter_map(|x| x.0.bound_tok_s(probes, &x.2))),
            of_bound: mean_of(ok.iter().filter_map(|x| x.0.of_bound(probes))),
            same_text: (!texts.is_empty()).then(|| texts.iter().all(|t| *t)),
            prefill_s: trailer_mean("prefill_s"),
            prefill_read_multiple: trailer_mean("prefill_read_multiple"),
        });
    }
    Ok(out)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "—".into())
}

/// The cells table (markdown): one row per cell, the baseline first.
pub fn cells_table(s: &[CellSummary]) -> String {
    let mut out = String::new();
    let base = s.first().map(|c| c.mean_tok_s).unwrap_or(0.0);
    let base_prefill = s.first().and_then(|c| c.prefill_s);
    let _ = writeln!(
        out,
        "| cell | runs | tok/s | 95% CI | per run | x baseline | effective | MiB/token | hit % | \
         stall s/token | majflt/token | acceptance % | tok/verify | drafted steps | peak RSS MiB | \
         bound tok/s | of bound | prefill s | prefill x baseline | prefill reads x distinct | \
         text = baseline |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (i, c) in s.iter().enumerate() {
        let mut name = c.name.clone();
        if i == 0 {
            name.push_str(" (baseline)");
        }
        if c.lossy {
            name.push_str(" LOSSY");
        }
        let runs = if c.failed > 0 {
            format!("{} ({} failed)", c.runs, c.failed)
        } else {
            c.runs.to_string()
        };
        if c.per_run_tok_s.is_empty() {
            let _ = writeln!(
                out,
                "| {name} | {runs} | — | | | | | | | | | | | | | | | | | | |"
            );
            continue;
        }
        let per_run = c
            .per_run_tok_s
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" / ");
        let ratio = if base > 0.0 {
            format!("{:.2}x", c.mean_tok_s / base)
        } else {
            "—".into()
        };
        let of_bound = c
            .of_bound
            .map_or_else(|| "—".into(), |x| format!("{:.0}%", x * 100.0));
        let prefill_ratio = c
            .prefill_s
            .zip(base_prefill)
            .filter(|(_, b)| *b > 0.0)
            .map(|(p, b)| p / b);
        let text = match c.same_text {
            Some(true) => "yes",
            Some(false) => "no",
            None => "—",
        };
        let _ = writeln!(
            out,
            "| {name} | {runs} | {:.2} | {:.2}–{:.2} | {per_run} | {ratio} | {:.2} | {} | {} | \
             {:.3} | {:.1} | {} | {} | {} | {} | {} | {of_bound} | {} | {} | {} | {text} |",
            c.mean_tok_s,
            c.ci.0,
            c.ci.1,
            c.effective_tok_s,
            // The mmap path's reads are page faults (majflt/token), not counted bytes.
            if c.resident {
                "—".to_string()
            } else {
                format!("{:.2}", c.mib_per_token)
            },
            opt(c.hit_pct, 1),
            c.stall_s_per_token,
            c.majflt_per_token,
            opt(c.acceptance_pct, 1),
            opt(c.tokens_per_verify, 2),
            c.drafted_steps.clone().unwrap_or_else(|| "—".into()),
            opt(c.peak_rss_mib, 0),
            opt(c.bound_tok_s, 2),
            opt(c.prefill_s, 2),
            prefill_ratio.map_or_else(|| "—".to_string(), |r| format!("{r:.2}x")),
            opt(c.prefill_read_multiple, 2),
        );
    }
    out
}

/// The probe steps (markdown), one row per round: bandwidth per probe set
/// and depth, the resident rate, the step's seconds, other processes' CPU,
/// the device's time per read and flags; then what each set reads and each
/// column's spread.
pub fn probes_table(probes: &[RoundProbe], sets: &[ProbeSlices], slice_bytes: u64) -> String {
    let mut out = String::new();
    let columns: Vec<(usize, u32)> = probes
        .first()
        .map(|p| {
            let per_set = p.bound.read_bytes_per_s.iter().enumerate();
            per_set
                .flat_map(|(s, v)| v.iter().map(move |x| (s, x.0)))
                .collect()
        })
        .unwrap_or_default();
    let name = |s: usize| sets.get(s).map_or("?", |x| x.name.as_str());
    let head: String = columns
        .iter()
        .map(|&(s, d)| format!(" {} d{d} MiB/s |", name(s)))
        .collect();
    let _ = writeln!(
        out,
        "| round |{head} resident tok/s | step s | other CPU cores | device ms/read | flags |"
    );
    let _ = writeln!(
        out,
        "|---:|{}---:|---:|---:|---:|---|",
        "---:|".repeat(columns.len())
    );
    let bw = |p: &RoundProbe, (s, i): (usize, usize)| {
        let v = p.bound.read_bytes_per_s.get(s)?;
        v.get(i).map(|x| x.1 / MIB)
    };
    let index = |k: usize| {
        let (s, _) = columns[k];
        (s, columns[..k].iter().filter(|c| c.0 == s).count())
    };
    for p in probes {
        let cells: String = (0..columns.len())
            .map(|k| bw(p, index(k)).map_or(" — |".into(), |x| format!(" {x:.1} |")))
            .collect();
        let _ = writeln!(
            out,
            "| {} |{cells} {:.2} | {:.1} | {:.2} | {} | {} |",
            p.round,
            p.bound.resident_tok_s,
            p.wall_s,
            p.conditions.other_cpu_cores,
            p.conditions
                .read_ms
                .map_or_else(|| "—".into(), |x| format!("{x:.2}")),
            flags_cell(&p.flags)
        );
    }
    let _ = writeln!(
        out,
        "\nRandom reads (O_DIRECT, the engine's reader; {slice_bytes} B per expert slice) \
         drawn from each set's list; resident rate: a `--resident` decode of the bench's -n \
         tokens with the model in the page cache. The sets:"
    );
    for s in sets {
        let _ = writeln!(out, "- {}: {}", s.name, s.what);
    }
    let _ = writeln!(out, "\nSpread over the rounds (max / min − 1):");
    for (k, &(s, d)) in columns.iter().enumerate() {
        let v: Vec<f64> = probes.iter().filter_map(|p| bw(p, index(k))).collect();
        let _ = writeln!(out, "- {} depth {d}: {}", name(s), spread(&v, "MiB/s"));
    }
    let v: Vec<f64> = probes.iter().map(|p| p.bound.resident_tok_s).collect();
    let _ = writeln!(out, "- resident: {}", spread(&v, "tok/s"));
    out
}

/// `min–max unit (+x%)` of `v`.
fn spread(v: &[f64], unit: &str) -> String {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() || lo <= 0.0 {
        return "—".into();
    }
    format!("{lo:.1}–{hi:.1} {unit} (+{:.0}%)", (hi / lo - 1.0) * 100.0)
}

/// A flags list for a table cell (`—` when empty).
pub fn flags_cell(flags: &[String]) -> String {
    if flags.is_empty() {
        "—".into()
    } else {
        flags.join("; ").replace('|', "/")
    }
}

/// The ratios over all runs and over the unflagged ones (markdown): each
/// cell's paired ratio to the baseline with its 95% interval, and its mean
/// share of its rounds' bound.
pub fn ratios_table(cells: &[Cell], results: &[RunResult], probes: &[RoundProbe]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| cell | flagged runs | x baseline, all (rounds) | 95% CI | x baseline, unflagged (rounds) | \
         95% CI | of bound, all | of bound, unflagged |"
    );
    let _ = writeln!(out, "|---|---:|---:|---|---:|---|---:|---:|");
    let probe_flagged = |round: u32| of_round(probes, round).is_some_and(|p| !p.flags.is_empty());
    for (ci, c) in cells.iter().enumerate() {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.cell == ci).collect();
        let flagged = runs.iter().filter(|r| !r.flags.is_empty()).count();
        let ratio = |unflagged| match (ci, cell_ratio(results, ci, unflagged)) {
            (0, _) => ("1 (baseline)".to_string(), "—".to_string()),
            (_, None) => ("—".into(), "—".into()),
            (_, Some(r)) => (
                format!("{:.3}x ({})", r.ratio, r.n),
                r.ci.map_or_else(|| "—".into(), |(lo, hi)| format!("{lo:.3}–{hi:.3}")),
            ),
        };
        let of_bound = |unflagged: bool| {
            let v: Vec<f64> = runs
                .iter()
                .filter(|r| !unflagged || (r.flags.is_empty() && !probe_flagged(r.run)))
                .filter_map(|r| r.of_bound(probes))
                .collect();
            of_bound_cell(&v)
        };
        let (all, all_ci) = ratio(false);
        let (clean, clean_ci) = ratio(true);
        let _ = writeln!(
            out,
            "| {} | {flagged} of {} | {all} | {all_ci} | {clean} | {clean_ci} | {} | {} |",
            c.name,
            runs.len(),
            of_bound(false),
            of_bound(true)
        );
    }
    out
}

/// Mean share of the bound over `runs` ("—" without any), and how many of
/// them were above their bound: a run faster than its round's probe allows
/// shows the probe is no ceiling for that cell, which is said beside the mean
/// (`benches/bench_agree.py` names it as the reason two benches' fractions
/// differ).
pub fn of_bound_cell(runs: &[f64]) -> String {
    let Some(mean) = mean_of(runs.iter().copied()) else {
        return "—".into();
    };
    let above = runs.iter().filter(|&&x| x > 1.0).count();
    if above == 0 {
        format!("{:.0}%", mean * 100.0)
    } else {
        format!(
            "{:.0}% ({above} of {} above the probe)",
            mean * 100.0,
            runs.len()
        )
    }
}

/// The preamble keys whose values differ between cells, per cell (the legend).
pub fn legend(results: &[RunResult], cells: &[Cell]) -> String {
    // Each cell's first run with a CSV, in cell order.
    let firsts: Vec<(&str, RunCsv)> = cells
        .iter()
        .enumerate()
        .filter_map(|(ci, c)| {
            results
                .iter()
                .find(|r| r.cell == ci)
                .and_then(|r| r.csv.clone())
                .map(|csv| (c.name.as_str(), csv))
        })
        .collect();
    let csvs: Vec<RunCsv> = firsts.iter().map(|f| f.1.clone()).collect();
    let keys: Vec<String> = compare::differing_keys(&csvs)
        .into_iter()
        .filter(|k| k != "model")
        .collect();
    let mut out = String::new();
    for c in cells {
        let _ = writeln!(out, "- `{}`: `bmoe run {}`", c.name, c.args.join(" "));
    }
    if !keys.is_empty() {
        let _ = writeln!(
            out,
            "\nResolved settings that differ (from each cell's CSV preamble):\n"
        );
        for (name, csv) in &firsts {
            let settings = keys
                .iter()
                .map(|k| {
                    format!(
                        "{k}={}",
                        csv.preamble.get(k).map(String::as_str).unwrap_or("-")
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(out, "- `{name}`: {settings}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::of_bound_cell;

    #[test]
    fn a_cell_faster_than_its_probe_says_how_many_runs_were() {
        assert_eq!(of_bound_cell(&[]), "—");
        assert_eq!(of_bound_cell(&[0.9, 0.8]), "85%");
        assert_eq!(
            of_bound_cell(&[1.0]),
            "100%",
            "at the bound is not above it"
        );
        assert_eq!(
            of_bound_cell(&[0.9, 1.3, 1.2]),
            "113% (2 of 3 above the probe)"
        );
    }
}
