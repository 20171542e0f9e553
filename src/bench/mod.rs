//! `bmoe bench`: a matrix of `bmoe run` configurations on one model and one
//! prompt, interleaved (ABAB), the baseline run once more than the others to
//! show the noise band, each run's CSV kept, and a `summary.md` that puts the
//! cells side by side with a bootstrap interval and the ratio to the host's
//! physical bound (from the same read probe and resident rate `bmoe probe`
//! measures).
//!
//! This module is the plan and the arithmetic (cells, presets, schedule,
//! bound, summary); [`runner`] spawns the runs and [`balloon`] emulates a
//! smaller host.

pub mod balloon;
pub mod runner;

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::compare::{self, RunCsv, RunFigures};

/// Errors of planning, running or summarizing a bench.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{source_name}:{line}: {msg}")]
    Cells {
        source_name: String,
        line: usize,
        msg: String,
    },
    #[error("unknown preset {name:?}; presets: {known}")]
    Preset { name: String, known: String },
    #[error("unknown workload {name:?}: give one of {known} or a prompt file that exists")]
    Workload { name: String, known: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("balloon: {0}")]
    Balloon(String),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Compare(#[from] compare::CompareError),
    #[error("stopped by signal {0} while measuring the bound")]
    Interrupted(i32),
}

/// One configuration of the matrix: a name and the `bmoe run` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub name: String,
    pub args: Vec<String>,
}

/// Split a flag line into arguments: whitespace-separated, with `"..."` or
/// `'...'` quoting (no escapes).
pub fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for ch in s.chars() {
        match quote {
            Some(q) if ch == q => quote = None,
            Some(_) => cur.push(ch),
            None if ch == '"' || ch == '\'' => {
                quote = Some(ch);
                in_word = true;
            }
            None if ch.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(ch);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Flags a cell may not set: the bench owns them (same model, prompt, token
/// count and CSV path for every cell).
const OWNED_FLAGS: &[&str] = &[
    "-m",
    "--model",
    "-p",
    "--prompt",
    "-f",
    "--file",
    "-n",
    "--n-predict",
    "--csv",
    "--progress",
    "--ignore-eos",
];

/// Parse a cells file: one `name: flags` per line, `#` comments, blank lines
/// ignored. The first cell is the baseline.
pub fn parse_cells(source_name: &str, text: &str) -> Result<Vec<Cell>, BenchError> {
    let mut cells: Vec<Cell> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |msg: String| BenchError::Cells {
            source_name: source_name.to_string(),
            line: i + 1,
            msg,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, flags) = line.split_once(':').ok_or_else(|| {
            err("expected `name: flags` (e.g. `c0-overlap: --cache-mb 0 --overlap`)".into())
        })?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(format!(
                "cell name {name:?}: use letters, digits, '-', '_' or '.' (it names the CSV)"
            )));
        }
        if cells.iter().any(|c| c.name == name) {
            return Err(err(format!("cell {name:?} is defined twice")));
        }
        let args = split_args(flags).map_err(err)?;
        if let Some(f) = args.iter().find(|a| {
            OWNED_FLAGS
                .iter()
                .any(|o| *a == o || a.starts_with(&format!("{o}=")))
        }) {
            return Err(err(format!(
                "{f} is set by the bench for every cell (--model, --workload, --tokens, -o, --ignore-eos)"
            )));
        }
        cells.push(Cell {
            name: name.to_string(),
            args,
        });
    }
    if cells.is_empty() {
        return Err(BenchError::Cells {
            source_name: source_name.to_string(),
            line: text.lines().count(),
            msg: "no cells (one `name: flags` per line)".into(),
        });
    }
    Ok(cells)
}

/// The built-in matrices: (name, what it answers, cells file text).
pub const PRESETS: &[(&str, &str, &str)] = &[
    (
        "cache",
        "hit rate and tok/s over the cache budget (0, 10, 25, 50, 100% of the expert bytes) \
         for serial, overlap and overlap + predictive prefetch",
        "c0-serial: --cache-mb 0\n\
         c0-overlap: --cache-mb 0 --overlap\n\
         c0-predict: --cache-mb 0 --overlap --predict-prefetch\n\
         c10-serial: --cache-mb 10%\n\
         c10-overlap: --cache-mb 10% --overlap\n\
         c10-predict: --cache-mb 10% --overlap --predict-prefetch\n\
         c25-serial: --cache-mb 25%\n\
         c25-overlap: --cache-mb 25% --overlap\n\
         c25-predict: --cache-mb 25% --overlap --predict-prefetch\n\
         c50-serial: --cache-mb 50%\n\
         c50-overlap: --cache-mb 50% --overlap\n\
         c50-predict: --cache-mb 50% --overlap --predict-prefetch\n\
         c100-serial: --cache-mb 100%\n\
         c100-overlap: --cache-mb 100% --overlap\n\
         c100-predict: --cache-mb 100% --overlap --predict-prefetch\n\
         resident: --resident\n",
    ),
    (
        "overlap",
        "the lossless overlap and prefetch recipes with no cache (--cache-mb 0)",
        "c0-serial: --cache-mb 0\n\
         c0-overlap: --cache-mb 0 --overlap\n\
         c0-prefetch1: --cache-mb 0 --overlap --prefetch 1\n\
         c0-predict: --cache-mb 0 --predict-prefetch\n\
         c0-overlap-predict: --cache-mb 0 --overlap --predict-prefetch\n\
         c0-overlap-predict-t1: --cache-mb 0 --overlap --predict-prefetch -t 1\n\
         resident: --resident\n",
    ),
    (
        "small-host",
        "llama.cpp's mmap path (the baseline) against streaming, for use with --ram-limit-mb",
        "mmap: --resident\n\
         c0-overlap-predict-t1: --cache-mb 0 --overlap --predict-prefetch -t 1\n\
         c25-overlap-predict: --cache-mb 25% --overlap --predict-prefetch\n\
         auto-overlap-predict: --cache-mb auto --overlap --predict-prefetch\n",
    ),
    (
        "spec",
        "n-gram speculation against no speculation, resident (run it with -w copy and -w prose)",
        "off: --resident\n\
         ngram-d1: --resident --ngram --draft 1\n\
         ngram-d2: --resident --ngram --draft 2\n\
         ngram-d3: --resident --ngram --draft 3\n\
         ngram-d4: --resident --ngram --draft 4\n",
    ),
    (
        "spec-stream",
        "n-gram speculation streamed (25% cache, overlap): off against draft widths 1-4",
        "off: --cache-mb 25% --overlap\n\
         ngram-d1: --cache-mb 25% --overlap --ngram --draft 1\n\
         ngram-d2: --cache-mb 25% --overlap --ngram --draft 2\n\
         ngram-d3: --cache-mb 25% --overlap --ngram --draft 3\n\
         ngram-d4: --cache-mb 25% --overlap --ngram --draft 4\n",
    ),
    (
        "lossy",
        "the two lossy knobs against the lossless serial run at --cache-mb 0",
        "c0-serial: --cache-mb 0\n\
         c0-drop075: --cache-mb 0 --drop-cold-experts 0.75\n\
         c0-top2: --cache-mb 0 --n-expert-used 2\n",
    ),
];

/// The cells of a preset.
pub fn preset(name: &str) -> Result<Vec<Cell>, BenchError> {
    match PRESETS.iter().find(|p| p.0 == name) {
        Some((n, _, text)) => parse_cells(&format!("preset {n}"), text),
        None => Err(BenchError::Preset {
            name: name.to_string(),
            known: PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The shipped prompts (benches/workloads/): (name, text).
pub const WORKLOADS: &[(&str, &str)] = &[
    ("prose", include_str!("../../benches/workloads/prose.txt")),
    ("copy", include_str!("../../benches/workloads/copy.txt")),
    ("long", include_str!("../../benches/workloads/long.txt")),
];

/// A shipped workload by name, or the text of a prompt file.
pub fn workload(name: &str) -> Result<(String, String), BenchError> {
    if let Some((n, t)) = WORKLOADS.iter().find(|w| w.0 == name) {
        return Ok((n.to_string(), t.to_string()));
    }
    let path = std::path::Path::new(name);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .map(|t| (path.display().to_string(), t))
            .map_err(|source| BenchError::Io {
                what: "read the prompt file",
                path: path.to_path_buf(),
                source,
            });
    }
    Err(BenchError::Workload {
        name: name.to_string(),
        known: WORKLOADS.iter().map(|w| w.0).collect::<Vec<_>>().join(", "),
    })
}

/// Read `path` once through the page cache (so a following resident run
/// measures compute, not the disk). Returns the bytes read and the time taken.
pub fn warm_page_cache(path: &std::path::Path) -> std::io::Result<(u64, std::time::Duration)> {
    use std::io::Read;
    let t0 = std::time::Instant::now();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((total, t0.elapsed()))
}

/// The run order: `repeats` rounds, each visiting every cell in order
/// (A B C A B C, never A A B B), then the baseline (cell 0) once more, so the
/// baseline has at least two runs spread over the whole matrix.
/// Items are (cell index, run number of that cell, from 1).
pub fn schedule(n_cells: usize, repeats: u32) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    if n_cells == 0 {
        return out;
    }
    for r in 1..=repeats.max(1) {
        for c in 0..n_cells {
            out.push((c, r));
        }
    }
    out.push((0, repeats.max(1) + 1));
    out
}

/// The host's physical limits for this model, from the probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Bound {
    /// Decode tok/s of a resident run without memory pressure (compute bound).
    pub resident_tok_s: f64,
    /// Random expert-slice read bandwidth, bytes/s, per queue depth.
    pub read_bytes_per_s: Vec<(u32, f64)>,
}

impl Bound {
    /// The best probed bandwidth at a queue depth not above `depth` (a reader
    /// at depth d can do what it did at any shallower depth; the shallowest
    /// probed depth when all are deeper).
    pub fn bandwidth_at(&self, depth: u32) -> Option<f64> {
        let within = self
            .read_bytes_per_s
            .iter()
            .filter(|p| p.0 <= depth)
            .map(|p| p.1)
            .reduce(f64::max);
        within.or_else(|| {
            self.read_bytes_per_s
                .iter()
                .min_by_key(|p| p.0)
                .map(|p| p.1)
        })
    }

    /// The overlapped bound for a run reading `bytes_per_token` at queue depth
    /// `depth`: min(resident rate, bandwidth / bytes per token). A run that
    /// reads nothing is bound by compute alone.
    pub fn tok_s(&self, depth: u32, bytes_per_token: f64) -> f64 {
        match self.bandwidth_at(depth) {
            Some(bw) if bytes_per_token > 0.0 => self.resident_tok_s.min(bw / bytes_per_token),
            _ => self.resident_tok_s,
        }
    }
}

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
    let _ = writeln!(
        out,
        "| cell | runs | tok/s | 95% CI | per run | x baseline | effective | MiB/token | hit % | \
         stall s/token | majflt/token | acceptance % | tok/verify | drafted steps | peak RSS MiB | \
         bound tok/s | of bound | text = baseline |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
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
            let _ = writeln!(out, "| {name} | {runs} | — | | | | | | | | | | | | | | | |");
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
        let text = match c.same_text {
            Some(true) => "yes",
            Some(false) => "no",
            None => "—",
        };
        let _ = writeln!(
            out,
            "| {name} | {runs} | {:.2} | {:.2}–{:.2} | {per_run} | {ratio} | {:.2} | {} | {} | \
             {:.3} | {:.1} | {} | {} | {} | {} | {} | {of_bound} | {text} |",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_args_handles_quotes_and_spaces() {
        assert_eq!(
            split_args("  --cache-mb 0   --overlap ").unwrap(),
            vec!["--cache-mb", "0", "--overlap"]
        );
        assert_eq!(
            split_args("--inject-faults 'seed=1, eio=0.1' -x\"a b\"").unwrap(),
            vec!["--inject-faults", "seed=1, eio=0.1", "-xa b"]
        );
        assert_eq!(split_args("\"\"").unwrap(), vec![""]);
        assert!(split_args("--a 'open").is_err());
    }

    #[test]
    fn cells_parse_with_comments_and_refuse_bad_lines() {
        let c = parse_cells(
            "f",
            "# the baseline first\nserial: --cache-mb 0\n\nov: --cache-mb 0 --overlap\n",
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].name, "serial");
        assert_eq!(c[1].args, vec!["--cache-mb", "0", "--overlap"]);
        let e = parse_cells("f", "a: --overlap\na: --resident\n").unwrap_err();
        assert!(
            e.to_string().contains("f:2") && e.to_string().contains("twice"),
            "{e}"
        );
        let e = parse_cells("f", "no colon here\n").unwrap_err();
        assert!(e.to_string().contains("f:1"), "{e}");
        let e = parse_cells("f", "x/y: --overlap\n").unwrap_err();
        assert!(e.to_string().contains("cell name"), "{e}");
        let e = parse_cells("f", "a: --model other.gguf\n").unwrap_err();
        assert!(e.to_string().contains("set by the bench"), "{e}");
        let e = parse_cells("f", "a: --csv=x.csv\n").unwrap_err();
        assert!(e.to_string().contains("set by the bench"), "{e}");
        assert!(parse_cells("f", "# nothing\n").is_err());
    }

    #[test]
    fn every_preset_parses_and_unknown_ones_are_named() {
        for (name, _, _) in PRESETS {
            assert!(!preset(name).unwrap().is_empty());
        }
        let cache = preset("cache").unwrap();
        assert_eq!(cache.len(), 16);
        assert!(cache.iter().any(|c| c.args.contains(&"25%".to_string())));
        let e = preset("nope").unwrap_err().to_string();
        assert!(e.contains("cache") && e.contains("small-host"), "{e}");
    }

    #[test]
    fn workloads_are_shipped_and_unknown_names_fail() {
        for (name, text) in WORKLOADS {
            assert!(text.len() > 40, "{name} is too short");
            assert_eq!(workload(name).unwrap().1, *text);
        }
        assert!(workload("no-such-workload").is_err());
    }

    #[test]
    fn schedule_interleaves_and_repeats_the_baseline() {
        assert_eq!(
            schedule(3, 2),
            vec![(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)]
        );
        assert_eq!(schedule(1, 1), vec![(0, 1), (0, 2)]);
        assert_eq!(schedule(2, 0), vec![(0, 1), (1, 1), (0, 2)]);
        assert!(schedule(0, 3).is_empty());
    }

    #[test]
    fn bound_is_the_smaller_of_compute_and_bandwidth() {
        let mib = 1024.0 * 1024.0;
        let b = Bound {
            resident_tok_s: 30.0,
            read_bytes_per_s: vec![
                (1, 500.0 * mib),
                (2, 1700.0 * mib),
                (4, 1600.0 * mib),
                (16, 2000.0 * mib),
            ],
        };
        // The best at or below the depth (probe noise can make depth 4 < depth 2).
        assert_eq!(b.bandwidth_at(4), Some(1700.0 * mib));
        assert_eq!(b.bandwidth_at(8), Some(1700.0 * mib));
        assert_eq!(b.bandwidth_at(32), Some(2000.0 * mib));
        // Deeper than any probed depth is not assumed: depth 0 (resident) maps to the shallowest.
        assert_eq!(b.bandwidth_at(0), Some(500.0 * mib));
        // 170 MiB/token at 1700 MiB/s -> 10 tok/s, below compute.
        assert!((b.tok_s(4, 170.0 * mib) - 10.0).abs() < 1e-9);
        // Little read -> compute bound.
        assert_eq!(b.tok_s(4, 1.0 * mib), 30.0);
        assert_eq!(b.tok_s(4, 0.0), 30.0);
    }
}
