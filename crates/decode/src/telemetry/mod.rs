//! The telemetry actor: receives per-token rows over a bounded channel (never
//! blocking a decode: when it falls behind, rows are counted as dropped), writes
//! the CSV (a `# bmoe_metrics` header, a `key=value` preamble, one row per token,
//! a `# summary` trailer) and, with `--progress`, one `BMOE_PROGRESS {json}` line
//! per token. Each CSV row is flushed as written, so an interrupted run keeps them.

mod actor;
mod error;
mod handle;
mod json;
mod parts;
mod row;

pub use error::TelemetryError;
pub use handle::{open_csv, CsvOut, Telemetry, TelemetryConfig};
pub use json::{json_object, json_string};
pub use parts::{Cost, Reads, Remote, Speculation};
pub use row::{Row, COLUMNS};

/// Default capacity of the telemetry channel (rows in flight).
pub const CHANNEL_CAPACITY: usize = 1024;

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    #[test]
    fn accumulating_rows_adds_costs_and_keeps_identity() {
        let one = Row {
            step: 7,
            cost: Cost {
                wall_ms: 1.5,
                ..Cost::default()
            },
            reads: Reads {
                read_bytes: 10,
                hits: 2,
                ..Reads::default()
            },
            batch: 512,
            text: "x".into(),
            ..Row::default()
        };
        let mut sum = Row {
            step: 0,
            prefill: true,
            ..Row::default()
        };
        sum.accumulate(&one);
        sum.accumulate(&one);
        assert_eq!(
            (
                sum.cost.wall_ms,
                sum.reads.read_bytes,
                sum.reads.hits,
                sum.batch
            ),
            (3.0, 20, 4, 1024)
        );
        assert_eq!((sum.step, sum.prefill, sum.text.as_str()), (0, true, ""));
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(json_object(&[("k".into(), "1".into())]), "{\"k\":1}");
        let odd = [
            ("a".into(), "NA".into()),
            ("b".into(), String::new()),
            ("c".into(), "-0.5".into()),
        ];
        assert_eq!(json_object(&odd), "{\"a\":\"NA\",\"b\":\"\",\"c\":-0.5}");
        let literals = [("d".into(), "null".into()), ("e".into(), "\"x\"".into())];
        assert_eq!(json_object(&literals), "{\"d\":null,\"e\":\"x\"}");
    }

    #[test]
    fn csv_has_header_preamble_rows_and_trailer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        let cfg = TelemetryConfig {
            csv: Some(path.clone()),
            progress: false,
            channel_capacity: 8,
        };
        let t = Telemetry::start(
            &cfg,
            Some(open_csv(&path).unwrap()),
            &[("mode".into(), "stream".into())],
        )
        .unwrap();
        for step in 0..3 {
            t.row(Row {
                step,
                reads: Reads {
                    read_bytes: 10,
                    ..Reads::default()
                },
                ..Default::default()
            });
        }
        let n = t
            .finish(
                vec![("read_bytes_total".into(), "30".into())],
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(n, 3);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# bmoe_metrics");
        assert_eq!(lines[1], "# mode=stream");
        assert_eq!(lines[2], COLUMNS.join(","));
        assert!(lines[3].starts_with("0,"));
        assert_eq!(lines[6], "# summary");
        assert_eq!(lines[7], "# read_bytes_total=30");
        assert_eq!(lines[8], "# dropped_events=0");
    }

    #[test]
    fn an_unwritable_csv_is_refused_with_the_fix() {
        let e = open_csv(Path::new("/nonexistent-dir/x.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("writable --csv"), "{e}");
    }
}
