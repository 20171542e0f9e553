//! The tables of `summary.md` (markdown): the cells side by side, the probe
//! steps with their spread, the ratios over all runs and the unflagged ones,
//! and the legend of the settings that differ between cells.

use std::fmt::Write as _;

use super::bound::{of_round, RoundProbe};
use super::summary::{cell_ratio, mean_of};
use super::traced::ProbeSlices;
use super::{cells::Cell, summary::CellSummary, summary::RunResult};
use crate::lab::compare::{self, RunCsv};

const MIB: f64 = 1024.0 * 1024.0;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "—".into())
}

/// The cells table's head (markdown).
const CELLS_HEAD: &str = "| cell | runs | tok/s | 95% CI | per run | x baseline | effective | \
     MiB/token | hit % | stall s/token | majflt/token | acceptance % | tok/verify | drafted steps | \
     peak RSS MiB | read bound tok/s | compute bound tok/s | overlap bound tok/s | of bound | \
     prefill s | prefill x baseline | prefill reads x distinct | text = baseline |
|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|
";

/// The cells table (markdown): one row per cell, the baseline first.
pub fn cells_table(s: &[CellSummary]) -> String {
    let base = s.first().map(|c| c.mean_tok_s).unwrap_or(0.0);
    let base_prefill = s.first().and_then(|c| c.prefill.s);
    let mut out = String::from(CELLS_HEAD);
    for (i, c) in s.iter().enumerate() {
        out.push_str(&cell_row(c, i == 0, base, base_prefill));
    }
    out
}

/// A cell's name and runs as the table shows them.
fn name_and_runs(c: &CellSummary, baseline: bool) -> (String, String) {
    let mut name = c.name.clone();
    if baseline {
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
    (name, runs)
}

/// One cell's row, against the baseline's rate `base` and prefill seconds.
fn cell_row(c: &CellSummary, baseline: bool, base: f64, base_prefill: Option<f64>) -> String {
    let (name, runs) = name_and_runs(c, baseline);
    if c.per_run_tok_s.is_empty() {
        return format!("| {name} | {runs} | — | | | | | | | | | | | | | | | | | | | | |\n");
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
        .bound
        .and_then(|b| b.reached)
        .map_or_else(|| "—".into(), |x| format!("{:.0}%", x * 100.0));
    let prefill_ratio = c
        .prefill
        .s
        .zip(base_prefill)
        .filter(|(_, b)| *b > 0.0)
        .map(|(p, b)| p / b);
    let text = match c.same_text {
        Some(true) => "yes",
        Some(false) => "no",
        None => "—",
    };
    // The mmap path's reads are page faults (majflt/token), not counted bytes.
    let mib_per_token = match c.resident {
        true => "—".to_string(),
        false => format!("{:.2}", c.reads.mib_per_token),
    };
    format!(
        "| {name} | {runs} | {:.2} | {:.2}–{:.2} | {per_run} | {ratio} | {:.2} | {mib_per_token} | \
         {} | {:.3} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {of_bound} | {} | {} | {} | \
         {text} |\n",
        c.mean_tok_s,
        c.ci.0,
        c.ci.1,
        c.effective_tok_s,
        opt(c.reads.hit_pct, 1),
        c.reads.stall_s_per_token,
        c.reads.majflt_per_token,
        opt(c.spec.acceptance_pct, 1),
        opt(c.spec.tokens_per_verify, 2),
        c.spec.drafted_steps.clone().unwrap_or_else(|| "—".into()),
        opt(c.peak_rss_mib, 0),
        opt(c.bound.and_then(|b| b.tok_s.read_tok_s), 2),
        opt(c.bound.map(|b| b.tok_s.compute_tok_s), 2),
        opt(c.bound.map(|b| b.tok_s.overlap_tok_s), 2),
        opt(c.prefill.s, 2),
        prefill_ratio.map_or_else(|| "—".to_string(), |r| format!("{r:.2}x")),
        opt(c.prefill.read_multiple, 2),
    )
}

/// The probe steps (markdown), one row per round: bandwidth per probe set
/// and depth, the resident rate, the step's seconds, other processes' CPU,
/// the device's time per read and flags; then what each set reads and each
/// column's spread.
pub(crate) fn probes_table(
    probes: &[RoundProbe],
    sets: &[ProbeSlices],
    slice_bytes: u64,
) -> String {
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
pub(crate) fn flags_cell(flags: &[String]) -> String {
    if flags.is_empty() {
        "—".into()
    } else {
        flags.join("; ").replace('|', "/")
    }
}

/// The ratios over all runs and over the unflagged ones (markdown): each
/// cell's paired ratio to the baseline with its 95% interval, and its mean
/// share of its rounds' bound.
pub(crate) fn ratios_table(cells: &[Cell], results: &[RunResult], probes: &[RoundProbe]) -> String {
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
pub(crate) fn of_bound_cell(runs: &[f64]) -> String {
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
    use super::{cells_table, of_bound_cell};
    use crate::lab::bench::summary::CellSummary;
    use crate::lab::bench::summary::{CellBound, CellPrefill, CellReads, CellSpec, RunBounds};

    /// A cell as a bench of 2 December summarized it.
    fn cell(name: &str, per_run: &[f64], mean: f64, prefill_s: f64) -> CellSummary {
        CellSummary {
            name: name.into(),
            runs: per_run.len(),
            failed: 0,
            per_run_tok_s: per_run.to_vec(),
            mean_tok_s: mean,
            ci: (2.37, 2.96),
            effective_tok_s: mean,
            reads: CellReads {
                mib_per_token: 189.84,
                hit_pct: Some(0.0),
                stall_s_per_token: 0.345,
                majflt_per_token: 0.0,
            },
            spec: CellSpec {
                acceptance_pct: None,
                tokens_per_verify: None,
                drafted_steps: None,
            },
            peak_rss_mib: Some(186.0),
            resident: false,
            lossy: false,
            bound: Some(CellBound {
                tok_s: RunBounds {
                    read_tok_s: Some(3.26),
                    compute_tok_s: 6.1,
                    overlap_tok_s: 3.26,
                },
                reached: Some(0.81),
            }),
            same_text: Some(true),
            prefill: CellPrefill {
                s: Some(prefill_s),
                read_multiple: Some(1.0),
            },
        }
    }

    #[test]
    fn the_cells_table_reads_as_the_saved_summaries_do() {
        let base = cell("c0-serial", &[2.38, 2.44, 2.41, 2.44, 3.44], 2.62, 2.14);
        let mut other = cell("c0-overlap", &[5.39, 3.06], 3.43, 1.30);
        other.resident = true;
        other.lossy = true;
        other.failed = 1;
        let mut none = cell("broken", &[], 0.0, 0.0);
        none.runs = 2;
        none.failed = 2;
        let t = cells_table(&[base, other, none]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| cell | runs | tok/s | 95% CI | per run | x baseline | effective | MiB/token | hit % | \
             stall s/token | majflt/token | acceptance % | tok/verify | drafted steps | peak RSS MiB | \
             read bound tok/s | compute bound tok/s | overlap bound tok/s | of bound | prefill s | \
             prefill x baseline | prefill reads x distinct | text = baseline |"
        );
        assert_eq!(
            lines[1],
            "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        // docs/results/bench-20261202-22-a/summary.md, the baseline's row.
        assert_eq!(
            lines[2],
            "| c0-serial (baseline) | 5 | 2.62 | 2.37–2.96 | 2.38 / 2.44 / 2.41 / 2.44 / 3.44 | \
             1.00x | 2.62 | 189.84 | 0.0 | 0.345 | 0.0 | — | — | — | 186 | 3.26 | 6.10 | 3.26 | 81% | \
             2.14 | \
             1.00x | 1.00 | yes |"
        );
        assert_eq!(
            lines[3],
            "| c0-overlap LOSSY | 2 (1 failed) | 3.43 | 2.37–2.96 | 5.39 / 3.06 | 1.31x | 3.43 | — | \
             0.0 | 0.345 | 0.0 | — | — | — | 186 | 3.26 | 6.10 | 3.26 | 81% | 1.30 | 0.61x | 1.00 | \
             yes |"
        );
        assert_eq!(
            lines[4],
            "| broken | 2 (2 failed) | — | | | | | | | | | | | | | | | | | | | | |"
        );
        assert_eq!(lines.len(), 5);
    }

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
