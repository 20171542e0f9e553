//! `bmoe compare A.csv B.csv ...`: runs side by side from their telemetry CSVs.
//!
//! Pure (no llama.cpp): parses the `# bmoe_metrics` format written by the
//! telemetry actor, computes per-run figures over the single-token decode rows
//! (the prompt's prefill row is reported apart in the CSV, not here), and a
//! bootstrap confidence interval of the decode rate over the per-token series.

mod bootstrap;
mod csv;
mod error;
mod render;
mod run_figures;

pub(crate) use bootstrap::rate_with_ci_runs;
pub use csv::RunCsv;
pub use error::CompareError;
pub use render::compare;
pub use run_figures::{differing_keys, figures, RunFigures, BOOTSTRAP_RESAMPLES};

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::path::Path;

    use super::bootstrap::rate_with_ci;

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
