//! `bmoe compare A.csv B.csv ...`: runs side by side from their telemetry CSVs.
//!
//! Pure (no llama.cpp): parses the `# bmoe_metrics` format written by the
//! telemetry actor, computes per-run figures over the single-token decode rows
//! (the prompt's prefill row is reported apart in the CSV, not here), and a
//! bootstrap confidence interval of the decode rate over the per-token series.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Errors of reading or comparing telemetry CSVs.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {msg} (is this a `bmoe run --csv` file?)")]
    Format {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("{path} has no decode rows (a run of at least 2 tokens is needed)")]
    Empty { path: PathBuf },
    #[error(
        "{a} is {a_kind} and {b} is {b_kind}: speculated and plain runs measure different \
         things; pass --mixed to compare them anyway"
    )]
    Mixed {
        a: PathBuf,
        a_kind: String,
        b: PathBuf,
        b_kind: String,
    },
    #[error("give at least one CSV to compare")]
    NoRuns,
    #[error(
        "{path} is not a regular file (a directory, a FIFO or a device): give a CSV written by \
         `bmoe run --csv`"
    )]
    NotAFile { path: PathBuf },
}

/// One run's CSV.
#[derive(Debug, Clone)]
pub struct RunCsv {
    pub path: PathBuf,
    pub preamble: BTreeMap<String, String>,
    pub trailer: BTreeMap<String, String>,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<f64>>,
}

impl RunCsv {
    /// Read and parse a run's CSV; anything but a regular file (which could
    /// block, like a FIFO, or never end, like /dev/zero) is refused unread.
    pub fn open(path: &Path) -> Result<Self, CompareError> {
        let read_err = |source| CompareError::Read {
            path: path.to_path_buf(),
            source,
        };
        if !std::fs::metadata(path).map_err(read_err)?.is_file() {
            return Err(CompareError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, CompareError> {
        let err = |line: usize, msg: String| CompareError::Format {
            path: path.to_path_buf(),
            line,
            msg,
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "# bmoe_metrics")) => {}
            _ => return Err(err(1, "first line is not `# bmoe_metrics`".into())),
        }
        let mut run = RunCsv {
            path: path.to_path_buf(),
            preamble: BTreeMap::new(),
            trailer: BTreeMap::new(),
            columns: Vec::new(),
            rows: Vec::new(),
        };
        let mut in_trailer = false;
        for (i, line) in lines {
            let n = i + 1;
            if line.is_empty() {
                continue;
            }
            if line == "# summary" {
                in_trailer = true;
                continue;
            }
            if let Some(kv) = line.strip_prefix("# ") {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| err(n, format!("`{line}` is not `# key=value`")))?;
                let map = if in_trailer {
                    &mut run.trailer
                } else {
                    &mut run.preamble
                };
                map.insert(k.to_owned(), v.to_owned());
                continue;
            }
            if in_trailer {
                return Err(err(n, "a row after the `# summary` trailer".into()));
            }
            if run.columns.is_empty() {
                run.columns = line.split(',').map(str::to_owned).collect();
                for need in ["wall_ms", "prefill"] {
                    if !run.columns.iter().any(|c| c == need) {
                        return Err(err(n, format!("no `{need}` column")));
                    }
                }
                continue;
            }
            let row: Vec<f64> = line
                .split(',')
                .map(|f| f.parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|e| err(n, format!("not a number row: {e}")))?;
            // Every column is a count, a time or a flag: never negative, NaN or infinite.
            if let Some(v) = row.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(err(
                    n,
                    format!("{v} is not a count or a time (a negative, NaN or infinite value)"),
                ));
            }
            if row.len() != run.columns.len() {
                return Err(err(
                    n,
                    format!("{} fields, the header has {}", row.len(), run.columns.len()),
                ));
            }
            run.rows.push(row);
        }
        if run.columns.is_empty() {
            return Err(err(1, "no column header".into()));
        }
        Ok(run)
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// Values of `name` over the single-token decode rows (0 where the column is absent).
    pub fn decode_series(&self, name: &str) -> Vec<f64> {
        let prefill = self.col("prefill");
        let c = self.col(name);
        self.rows
            .iter()
            .filter(|r| prefill.is_none_or(|p| r[p] == 0.0))
            .map(|r| c.map_or(0.0, |c| r[c]))
            .collect()
    }

    /// `off` for a plain run, the speculation source otherwise.
    pub fn spec(&self) -> &str {
        self.preamble.get("spec").map_or("off", String::as_str)
    }

    pub fn aborted(&self) -> bool {
        self.trailer.get("aborted").is_some_and(|v| v == "1")
            || (self.trailer.is_empty() && !self.rows.is_empty())
    }

    pub fn lossy(&self) -> bool {
        self.preamble.get("lossy").is_some_and(|v| v == "1")
    }
}

/// Decode rate and its bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateCi {
    pub tok_s: f64,
    pub lo: f64,
    pub hi: f64,
}

/// SplitMix64: a fixed-seed stream for the bootstrap (reproducible tables).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// tokens / seconds over per-token wall times, with a percentile bootstrap
/// interval (`resamples` draws with replacement, `level` e.g. 0.95, fixed seed).
pub fn rate_with_ci(wall_ms: &[f64], resamples: usize, level: f64, seed: u64) -> Option<RateCi> {
    let n = wall_ms.len();
    let total: f64 = wall_ms.iter().sum();
    if n == 0 || total <= 0.0 {
        return None;
    }
    let rate = |sum_ms: f64| n as f64 * 1000.0 / sum_ms;
    let mut rng = SplitMix(seed);
    let mut draws: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let s: f64 = (0..n)
                .map(|_| wall_ms[(rng.next() % n as u64) as usize])
                .sum();
            rate(s)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let q = |p: f64| draws[((p * (draws.len() - 1) as f64).round() as usize).min(draws.len() - 1)];
    let tail = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    Some(RateCi {
        tok_s: rate(total),
        lo: q(tail),
        hi: q(1.0 - tail),
    })
}

/// The decode rate of several runs of one configuration, with a two-level
/// (hierarchical) percentile bootstrap: each draw picks runs with replacement,
/// then per-token times within each picked run. With two or more runs the
/// interval covers the drift between runs (a shared host's state changes from
/// one run to the next), not only the token-to-token noise within one; with a
/// single run it is [`rate_with_ci`]. The point estimate is the pooled rate.
pub fn rate_with_ci_runs(
    runs: &[Vec<f64>],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Option<RateCi> {
    let runs: Vec<&Vec<f64>> = runs.iter().filter(|r| !r.is_empty()).collect();
    match runs.len() {
        0 => return None,
        1 => return rate_with_ci(runs[0], resamples, level, seed),
        _ => {}
    }
    let n: usize = runs.iter().map(|r| r.len()).sum();
    let total: f64 = runs.iter().flat_map(|r| r.iter()).sum();
    if total <= 0.0 {
        return None;
    }
    let mut rng = SplitMix(seed);
    let mut draws: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let (mut count, mut sum) = (0usize, 0.0f64);
            for _ in 0..runs.len() {
                let r = runs[(rng.next() % runs.len() as u64) as usize];
                for _ in 0..r.len() {
                    sum += r[(rng.next() % r.len() as u64) as usize];
                }
                count += r.len();
            }
            count as f64 * 1000.0 / sum
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let q = |p: f64| draws[((p * (draws.len() - 1) as f64).round() as usize).min(draws.len() - 1)];
    let tail = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    Some(RateCi {
        tok_s: n as f64 * 1000.0 / total,
        lo: q(tail),
        hi: q(1.0 - tail),
    })
}

/// One row of the comparison table.
#[derive(Debug, Clone)]
pub struct RunFigures {
    pub decodes: usize,
    pub rate: RateCi,
    /// Emitted tokens over all time spent (decode + drafting); = rate for plain runs.
    pub effective_tok_s: f64,
    pub mib_per_token: f64,
    pub hit_pct: Option<f64>,
    pub stall_ms_per_token: f64,
    pub majflt_per_token: f64,
    pub acceptance_pct: Option<f64>,
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

/// The whole comparison as markdown.
pub fn compare(runs: &[RunCsv], mixed: bool) -> Result<String, CompareError> {
    let first = runs.first().ok_or(CompareError::NoRuns)?;
    if !mixed {
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
    }
    let figs: Vec<RunFigures> = runs.iter().map(figures).collect::<Result<_, _>>()?;
    let legend = differing_keys(runs);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| run | decodes | tok/s [95% CI] | effective tok/s | MiB/token | hit % | stall ms/token | majflt/token | acceptance % |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    for (i, (r, f)) in runs.iter().zip(&figs).enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(cache: u32, walls: &[f64]) -> String {
        let mut s = format!(
            "# bmoe_metrics\n# engine_version=0.1.0\n# cache_mb={cache}\n# spec=off\n# lossy=0\n\
             step,wall_ms,stall_ms,read_bytes,cache_hits,cache_misses,majflt,prefill\n\
             0,900,1,1048576,0,4,0,1\n"
        );
        for (i, w) in walls.iter().enumerate() {
            let _ = writeln!(s, "{},{w},2,2097152,1,3,0,0", i + 1);
        }
        s.push_str("# summary\n# tokens=3\n# aborted=0\n");
        s
    }

    #[test]
    fn figures_use_decode_rows_only() {
        let r = RunCsv::parse(Path::new("a.csv"), &csv(0, &[100.0, 100.0, 100.0])).unwrap();
        let f = figures(&r).unwrap();
        assert_eq!(f.decodes, 3);
        assert!((f.rate.tok_s - 10.0).abs() < 1e-9);
        // Constant series: the interval collapses onto the rate.
        assert!((f.rate.lo - 10.0).abs() < 1e-9 && (f.rate.hi - 10.0).abs() < 1e-9);
        assert!((f.mib_per_token - 2.0).abs() < 1e-9);
        assert_eq!(f.hit_pct, Some(25.0));
        assert!((f.stall_ms_per_token - 2.0).abs() < 1e-9);
        assert_eq!(f.effective_tok_s, f.rate.tok_s);
        assert!(!r.aborted());
    }

    #[test]
    fn bootstrap_interval_brackets_the_rate_and_is_reproducible() {
        let walls: Vec<f64> = (0..64).map(|i| 50.0 + (i % 7) as f64 * 10.0).collect();
        let a = rate_with_ci(&walls, 2000, 0.95, 7).unwrap();
        let b = rate_with_ci(&walls, 2000, 0.95, 7).unwrap();
        assert_eq!(a, b);
        assert!(a.lo < a.tok_s && a.tok_s < a.hi, "{a:?}");
        // A wider level gives a wider interval.
        let w = rate_with_ci(&walls, 2000, 0.99, 7).unwrap();
        assert!(w.lo <= a.lo && w.hi >= a.hi);
    }

    #[test]
    fn run_level_bootstrap_widens_with_drift_between_runs() {
        let steady: Vec<f64> = (0..64).map(|i| 50.0 + (i % 5) as f64).collect();
        let slower: Vec<f64> = steady.iter().map(|w| w * 1.3).collect();
        // One run: the token-level interval.
        let one = rate_with_ci_runs(std::slice::from_ref(&steady), 2000, 0.95, 3).unwrap();
        assert_eq!(one, rate_with_ci(&steady, 2000, 0.95, 3).unwrap());
        // Two runs that disagree: the interval reaches both runs' rates.
        let two = rate_with_ci_runs(&[steady.clone(), slower.clone()], 2000, 0.95, 3).unwrap();
        let fast = rate_with_ci(&steady, 2000, 0.95, 3).unwrap().tok_s;
        let slow = rate_with_ci(&slower, 2000, 0.95, 3).unwrap().tok_s;
        assert!(
            two.lo <= slow * 1.01 && two.hi >= fast * 0.99,
            "{two:?} vs {slow} {fast}"
        );
        assert!(two.lo < two.tok_s && two.tok_s < two.hi);
        // The pooled point estimate.
        let pooled: Vec<f64> = steady.iter().chain(&slower).copied().collect();
        assert!((two.tok_s - rate_with_ci(&pooled, 10, 0.95, 3).unwrap().tok_s).abs() < 1e-9);
        assert!(rate_with_ci_runs(&[vec![], vec![]], 10, 0.95, 1).is_none());
    }

    #[test]
    fn legend_lists_only_differing_keys() {
        let a = RunCsv::parse(Path::new("a.csv"), &csv(0, &[100.0, 120.0])).unwrap();
        let b = RunCsv::parse(Path::new("b.csv"), &csv(256, &[80.0, 90.0])).unwrap();
        assert_eq!(differing_keys(&[a.clone(), b.clone()]), vec!["cache_mb"]);
        let table = compare(&[a, b], false).unwrap();
        assert!(table.contains("1: a.csv cache_mb=0"), "{table}");
        assert!(table.contains("2: b.csv cache_mb=256"), "{table}");
    }

    #[test]
    fn speculated_and_plain_are_refused_without_mixed() {
        let a = RunCsv::parse(Path::new("a.csv"), &csv(0, &[100.0, 120.0])).unwrap();
        let text = csv(0, &[80.0, 90.0]).replace("# spec=off", "# spec=ngram");
        let b = RunCsv::parse(Path::new("b.csv"), &text).unwrap();
        let e = compare(&[a.clone(), b.clone()], false).unwrap_err();
        assert!(matches!(e, CompareError::Mixed { .. }), "{e}");
        assert!(e.to_string().contains("--mixed"));
        assert!(compare(&[a, b], true).is_ok());
    }

    #[test]
    fn malformed_files_name_the_line() {
        let e = RunCsv::parse(Path::new("x.csv"), "step,wall_ms\n1,2\n").unwrap_err();
        assert!(e.to_string().contains("x.csv:1"), "{e}");
        let bad = csv(0, &[1.0]).replace("1,1,2,2097152", "1,oops,2,2097152");
        let e = RunCsv::parse(Path::new("y.csv"), &bad).unwrap_err();
        assert!(e.to_string().contains("y.csv:8"), "{e}");
        let no_trailer = csv(0, &[1.0, 2.0]).replace("# summary\n# tokens=3\n# aborted=0\n", "");
        assert!(RunCsv::parse(Path::new("z.csv"), &no_trailer)
            .unwrap()
            .aborted());
    }
}
