//! The markdown tables of `summary.md`: cells, probe steps, paired ratios
//! and the legend.

use super::*;

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
        out.push_str(&cell_row(i, c, base, base_prefill));
    }
    out
}

/// One cell's row of the cells table (`i` 0 is the baseline).
fn cell_row(i: usize, c: &CellSummary, base: f64, base_prefill: Option<f64>) -> String {
    let mut out = String::new();
    {
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
            return format!("| {name} | {runs} | — | | | | | | | | | | | | | | | | | | |\n");
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
