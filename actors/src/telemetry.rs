//! The telemetry actor: receives per-token rows over a bounded channel (never
//! blocking a decode: when it falls behind, rows are counted as dropped), writes
//! the CSV (a `# bmoe_metrics` header, a `key=value` preamble, one row per token,
//! a `# summary` trailer) and, with `--progress`, one `BMOE_PROGRESS {json}` line
//! per token. Each CSV row is flushed as written, so an interrupted run keeps them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::output::PendingFile;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// Default capacity of the telemetry channel (rows in flight).
pub const CHANNEL_CAPACITY: usize = 1024;

/// Errors of the telemetry actor.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot write the CSV {path}: {source} (choose a writable --csv path)")]
    Csv {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "writing BMOE_PROGRESS lines to stdout failed: {0} (the reader closed the pipe, or the \
         disk is full); generation stopped there"
    )]
    Progress(String),
    #[error(
        "writing the CSV {path} failed during the run: {source}; generation stopped there \
         (the rows before the failure are in the file)"
    )]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the telemetry actor did not stop within {0:?}")]
    Timeout(Duration),
}

/// One token's accounting. Under a multi-token decode (prefill), the whole
/// decode's cost is charged to its first row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub step: u64,
    pub wall_ms: f64,
    pub stall_ms: f64,
    pub io_ms: f64,
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub majflt: u64,
    pub minflt: u64,
    pub cpu_ms: f64,
    /// Tokens in the decode that produced this row (prompt length for the prefill).
    pub batch: u64,
    pub prefill: bool,
    /// Part of `read_bytes` that the flash actor read ahead (prefetch).
    pub prefetch_bytes: u64,
    /// Routed experts skipped by `--drop-cold-experts` (lossy).
    pub dropped_experts: u64,
    /// Speculation: rows of the verify decode that produced this token's group,
    /// on the group's first row (0 on the rest of the group and without speculation).
    pub mtp_batch: u64,
    /// Speculation: time spent drafting before that verify decode (group's first row).
    pub mtp_draft_ms: f64,
    /// Text this token completed (may be empty inside a multi-byte character).
    pub text: String,
}

impl Row {
    /// Add `other`'s costs and counts (one decode's) to this row: the prefill,
    /// which spans several micro-batches, is one row. Step, flags, the
    /// speculation columns and the text are left as they are.
    pub fn accumulate(&mut self, other: &Row) {
        self.batch += other.batch;
        self.wall_ms += other.wall_ms;
        self.stall_ms += other.stall_ms;
        self.io_ms += other.io_ms;
        self.read_bytes += other.read_bytes;
        self.hits += other.hits;
        self.misses += other.misses;
        self.evictions += other.evictions;
        self.majflt += other.majflt;
        self.minflt += other.minflt;
        self.cpu_ms += other.cpu_ms;
        self.prefetch_bytes += other.prefetch_bytes;
        self.dropped_experts += other.dropped_experts;
    }
}

/// The CSV columns, in order.
pub const COLUMNS: [&str; 17] = [
    "step",
    "wall_ms",
    "stall_ms",
    "io_ms",
    "read_bytes",
    "cache_hits",
    "cache_misses",
    "evictions",
    "majflt",
    "minflt",
    "cpu_ms",
    "batch",
    "prefill",
    "prefetch_bytes",
    "dropped_experts",
    "mtp_batch",
    "mtp_draft_ms",
];

impl Row {
    fn csv(&self) -> String {
        format!(
            "{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{:.3},{},{},{},{},{},{:.3}",
            self.step,
            self.wall_ms,
            self.stall_ms,
            self.io_ms,
            self.read_bytes,
            self.hits,
            self.misses,
            self.evictions,
            self.majflt,
            self.minflt,
            self.cpu_ms,
            self.batch,
            self.prefill as u8,
            self.prefetch_bytes,
            self.dropped_experts,
            self.mtp_batch,
            self.mtp_draft_ms
        )
    }

    /// The `BMOE_PROGRESS` JSON object.
    pub fn json(&self) -> String {
        let total = self.hits + self.misses;
        let hit_pct = if total == 0 {
            "null".to_string()
        } else {
            format!("{:.1}", self.hits as f64 * 100.0 / total as f64)
        };
        format!(
            "{{\"step\":{},\"wall_ms\":{:.3},\"io_ms\":{:.3},\"stall_ms\":{:.3},\"read_bytes\":{},\"cache_hit_pct\":{},\"majflt\":{},\"cpu_ms\":{:.3},\"text\":{}}}",
            self.step,
            self.wall_ms,
            self.io_ms,
            self.stall_ms,
            self.read_bytes,
            hit_pct,
            self.majflt,
            self.cpu_ms,
            json_string(&self.text)
        )
    }
}

/// A JSON string literal for `s`.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `{"k":v,...}` from key/value pairs whose values are already JSON.
pub fn json_object(pairs: &[(String, String)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}:{v}", json_string(k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

enum Event {
    Row(Row),
    End {
        trailer: Vec<(String, String)>,
        done: Sender<std::io::Result<()>>,
    },
}

/// Where telemetry goes.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    pub csv: Option<PathBuf>,
    /// Print `BMOE_PROGRESS {json}` lines on stdout.
    pub progress: bool,
    pub channel_capacity: usize,
}

/// Handle on the telemetry thread.
pub struct Telemetry {
    tx: Option<Sender<Event>>,
    join: Option<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    rows: Arc<AtomicU64>,
    csv: Option<PathBuf>,
    /// The CSV's temporary file, moved into place by `finish` (removed, the
    /// target untouched, when the telemetry is dropped unfinished).
    pending: Option<PendingFile>,
    /// The first failed progress line on stdout (then `write_failed` is set too).
    progress_failed: Arc<OnceLock<String>>,
    /// Set by the actor when a CSV write fails (generation stops at the next token).
    write_failed: Arc<AtomicBool>,
}

/// The CSV being written: rows go to a temporary file beside the target,
/// renamed over it when [`Telemetry::finish`] has written the trailer.
#[derive(Debug)]
pub struct CsvOut {
    file: File,
    pending: PendingFile,
}

/// Open the CSV now (so an unwritable path is refused before any work),
/// without touching the file already at `path`.
pub fn open_csv(path: &Path) -> Result<CsvOut, TelemetryError> {
    let (file, pending) = PendingFile::create(path).map_err(|source| TelemetryError::Csv {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(CsvOut { file, pending })
}

impl Telemetry {
    /// Start the actor; `csv_out` comes from [`open_csv`]. The header and the
    /// preamble are written before this returns.
    pub fn start(
        cfg: &TelemetryConfig,
        csv_out: Option<CsvOut>,
        preamble: &[(String, String)],
    ) -> Result<Self, TelemetryError> {
        let (csv_file, pending) = match csv_out {
            Some(c) => (Some(c.file), Some(c.pending)),
            None => (None, None),
        };
        let mut csv = csv_file.map(BufWriter::new);
        if let (Some(w), Some(path)) = (csv.as_mut(), cfg.csv.as_ref()) {
            let err = |source| TelemetryError::Csv {
                path: path.clone(),
                source,
            };
            writeln!(w, "# bmoe_metrics").map_err(err)?;
            for (k, v) in preamble {
                writeln!(w, "# {k}={v}").map_err(err)?;
            }
            writeln!(w, "{}", COLUMNS.join(",")).map_err(err)?;
            w.flush().map_err(err)?;
        }
        let (tx, rx) = bounded(cfg.channel_capacity.max(1));
        let progress = cfg.progress;
        let rows = Arc::new(AtomicU64::new(0));
        let rows2 = rows.clone();
        let write_failed = Arc::new(AtomicBool::new(false));
        let failed2 = write_failed.clone();
        let progress_failed = Arc::new(OnceLock::new());
        let progress2 = progress_failed.clone();
        let join = std::thread::Builder::new()
            .name("bmoe-telemetry".into())
            .spawn(move || run(rx, csv, progress.then_some(progress2), rows2, failed2))
            .map_err(|source| TelemetryError::Csv {
                path: PathBuf::from("<telemetry thread>"),
                source,
            })?;
        Ok(Self {
            tx: Some(tx),
            join: Some(join),
            dropped: Arc::new(AtomicU64::new(0)),
            rows,
            csv: cfg.csv.clone(),
            pending,
            progress_failed,
            write_failed,
        })
    }

    /// Whether a CSV write has failed (the run should stop: its measurement
    /// would be incomplete).
    pub fn write_failed(&self) -> bool {
        self.write_failed.load(Ordering::Relaxed)
    }

    /// Hand a row over without blocking; counted as dropped when the actor is behind.
    pub fn row(&self, row: Row) {
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
                tx.try_send(Event::Row(row))
            {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Rows the actor could not take in time.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Write the trailer (`dropped_events` is set to the final count, added
    /// when missing) and stop the actor within `deadline`.
    pub fn finish(
        mut self,
        mut trailer: Vec<(String, String)>,
        deadline: Duration,
    ) -> Result<u64, TelemetryError> {
        let dropped = self.dropped().to_string();
        match trailer.iter_mut().find(|(k, _)| k == "dropped_events") {
            Some(kv) => kv.1 = dropped,
            None => trailer.push(("dropped_events".into(), dropped)),
        }
        let (done_tx, done_rx) = bounded(1);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send_timeout(
                Event::End {
                    trailer,
                    done: done_tx,
                },
                deadline,
            );
        }
        let res = done_rx.recv_timeout(deadline);
        if let Some(j) = self.join.take() {
            // The actor answers `done` as its last step (or its thread ended,
            // dropping the sender): join it then. After a timeout it is left
            // running, detached, rather than blocking the run's end.
            if !matches!(res, Err(crossbeam_channel::RecvTimeoutError::Timeout)) {
                let _ = j.join();
            }
        }
        // What was written goes into place, trailer or not (a failed write
        // keeps the rows before it).
        if let Some(p) = self.pending.take() {
            let path = p.target().to_path_buf();
            p.commit()
                .map_err(|source| TelemetryError::Csv { path, source })?;
        }
        if let Some(e) = self.progress_failed.get() {
            return Err(TelemetryError::Progress(e.clone()));
        }
        match res {
            Ok(Ok(())) => Ok(self.rows.load(Ordering::Relaxed)),
            Ok(Err(source)) => Err(TelemetryError::Write {
                path: self.csv.clone().unwrap_or_default(),
                source,
            }),
            Err(_) => Err(TelemetryError::Timeout(deadline)),
        }
    }
}

/// The actor's loop; `progress` is where a failed progress line is recorded
/// (None: no progress lines).
fn run(
    rx: Receiver<Event>,
    mut csv: Option<BufWriter<File>>,
    progress: Option<Arc<OnceLock<String>>>,
    rows: Arc<AtomicU64>,
    write_failed: Arc<AtomicBool>,
) {
    let mut failed: Option<std::io::Error> = None;
    while let Ok(ev) = rx.recv() {
        match ev {
            Event::Row(r) => {
                let _span = tracing::debug_span!("telemetry.write", step = r.step).entered();
                if let Some(w) = csv.as_mut() {
                    if failed.is_none() {
                        if let Err(e) = writeln!(w, "{}", r.csv()).and_then(|_| w.flush()) {
                            failed = Some(e);
                            write_failed.store(true, Ordering::Relaxed);
                        }
                    }
                }
                if let Some(p) = progress.as_ref().filter(|p| p.get().is_none()) {
                    let mut out = std::io::stdout().lock();
                    let line = format!("BMOE_PROGRESS {}\n", r.json());
                    if let Err(e) = out.write_all(line.as_bytes()).and_then(|_| out.flush()) {
                        let _ = p.set(e.to_string());
                        write_failed.store(true, Ordering::Relaxed);
                    }
                }
                rows.fetch_add(1, Ordering::Relaxed);
            }
            Event::End { trailer, done } => {
                let res = match (csv.as_mut(), failed.take()) {
                    (_, Some(e)) => Err(e),
                    (Some(w), None) => (|| {
                        writeln!(w, "# summary")?;
                        for (k, v) in &trailer {
                            writeln!(w, "# {k}={v}")?;
                        }
                        w.flush()
                    })(),
                    (None, None) => Ok(()),
                };
                let _ = done.send(res);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulating_rows_adds_costs_and_keeps_identity() {
        let one = Row {
            step: 7,
            wall_ms: 1.5,
            read_bytes: 10,
            hits: 2,
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
            (sum.wall_ms, sum.read_bytes, sum.hits, sum.batch),
            (3.0, 20, 4, 1024)
        );
        assert_eq!((sum.step, sum.prefill, sum.text.as_str()), (0, true, ""));
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(json_object(&[("k".into(), "1".into())]), "{\"k\":1}");
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
                read_bytes: 10,
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
