//! The comparison as markdown: the mixed-runs check, the figures table, the
//! legend of differing preamble keys and the note on how rates are measured.

use std::fmt::Write as _;

use super::{
    csv::RunCsv, error::CompareError, run_figures::differing_keys, run_figures::figures,
    run_figures::RunFigures, run_figures::BOOTSTRAP_RESAMPLES,
};

/// The whole comparison as markdown.
pub fn compare(runs: &[RunCsv], mixed: bool) -> Result<String, CompareError> {
    let first = runs.first().ok_or(CompareError::NoRuns)?;
    if !mixed {
        refuse_mixed(runs, first)?;
    }
    let figs: Vec<RunFigures> = runs.iter().map(figures).collect::<Result<_, _>>()?;
    let legend = differing_keys(runs);
    let mut out = figures_table(runs, &figs);
    let _ = writeln!(out);
    for (i, r) in runs.iter().enumerate() {
        let mut desc = format!("{}: {}", i + 1, r.path.display());
        for k in &legend {
            let v = r.preamble.get(k).map_or("(absent)", String::as_str);
            let _ = write!(desc, " {k}={v}");
        }
        let _ = writeln!(out, "{desc}");
    }
    if legend.is_empty() {
        let _ = writeln!(
            out,
            "(the runs' preambles are identical: repeats of one configuration)"
        );
    }
    let _ = writeln!(
        out,
        "\nRates are decode tokens / decode seconds over the single-token decode rows (the \
         prefill row is left out); the interval is a {BOOTSTRAP_RESAMPLES}-draw percentile \
         bootstrap over the per-token wall times. Effective = tokens over decode plus drafting \
         time (equal to the rate without speculation)."
    );
    Ok(out)
}

/// Refuse plain and speculated runs side by side (they measure different things).
fn refuse_mixed(runs: &[RunCsv], first: &RunCsv) -> Result<(), CompareError> {
    let plain = |r: &RunCsv| r.spec() == "off";
    if let Some(other) = runs.iter().find(|r| plain(r) != plain(first)) {
        let kind = |r: &RunCsv| {
            if plain(r) {
                "plain".to_string()
            } else {
                format!("speculated ({})", r.spec())
            }
        };
        return Err(CompareError::Mixed {
            a: first.path.clone(),
            a_kind: kind(first),
            b: other.path.clone(),
            b_kind: kind(other),
        });
    }
    Ok(())
}

/// The figures table, one row per run, marked when lossy or aborted.
fn figures_table(runs: &[RunCsv], figs: &[RunFigures]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| run | decodes | tok/s [95% CI] | effective tok/s | MiB/token | hit % | stall ms/token | majflt/token | acceptance % |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    for (i, (r, f)) in runs.iter().zip(figs).enumerate() {
        let mut marks = Vec::new();
        if r.lossy() {
            marks.push("lossy");
        }
        if r.aborted() {
            marks.push("aborted");
        }
        let marks = if marks.is_empty() {
            String::new()
        } else {
            format!(" ({})", marks.join(", "))
        };
        let _ = writeln!(
            out,
            "| {}{} | {} | {:.2} [{:.2}, {:.2}] | {:.2} | {:.2} | {} | {:.1} | {:.1} | {} |",
            i + 1,
            marks,
            f.decodes,
            f.rate.tok_s,
            f.rate.lo,
            f.rate.hi,
            f.effective_tok_s,
            f.mib_per_token,
            opt(f.hit_pct),
            f.stall_ms_per_token,
            f.majflt_per_token,
            opt(f.acceptance_pct),
        );
    }
    out
}
