//! The bench summary: each cell's runs pooled into figures, and the markdown
//! tables (cells, probe bound, legend) of `summary.md`.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{BenchError, Bound, Cell};
use crate::compare::{self, RunCsv, RunFigures};

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
    pub io_depth: u32,
    pub bound_tok_s: Option<f64>,
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

fn trailer_f64(csv: &RunCsv, key: &str) -> Option<f64> {
    csv.trailer.get(key).and_then(|v| v.parse::<f64>().ok())
}

/// Pool the runs of each cell.
pub fn summarize(
    cells: &[Cell],
    results: &[RunResult],
    bound: Option<&Bound>,
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
        let opt_avg = |f: fn(&RunFigures) -> Option<f64>| {
            let v: Vec<f64> = ok.iter().filter_map(|x| f(&x.2)).collect();
            (!v.is_empty()).then(|| mean(&v))
        };
        let first = ok.first().map(|x| x.1);
        let pre = |k: &str| first.and_then(|c| c.preamble.get(k).cloned());
        let resident = pre("mode").as_deref() == Some("resident");
        let io_depth = pre("io_threads").and_then(|v| v.parse().ok()).unwrap_or(0);
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
        let trailer_mean = |key: &str| {
            let v: Vec<f64> = ok.iter().filter_map(|x| trailer_f64(x.1, key)).collect();
            (!v.is_empty()).then(|| mean(&v))
        };
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
            io_depth,
            bound_tok_s: (!ok.is_empty())
                .then_some(bound)
                .flatten()
                .map(|b| b.tok_s(io_depth, mib_per_token * 1024.0 * 1024.0)),
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
            .bound_tok_s
            .filter(|b| *b > 0.0)
            .map(|b| format!("{:.0}%", c.mean_tok_s * 100.0 / b))
            .unwrap_or_else(|| "—".into());
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

/// The probe table (markdown).
pub fn bound_table(b: &Bound, slice_bytes: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "resident compute rate: {:.2} tok/s (no memory pressure)\n",
        b.resident_tok_s
    );
    let _ = writeln!(
        out,
        "| queue depth | read MiB/s ({} B slices, O_DIRECT) |\n|---:|---:|",
        slice_bytes
    );
    for (d, bw) in &b.read_bytes_per_s {
        let _ = writeln!(out, "| {d} | {:.1} |", bw / (1024.0 * 1024.0));
    }
    out
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
