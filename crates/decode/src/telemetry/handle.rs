//! The telemetry's handle: the CSV opened up front, the actor started with the
//! header and preamble written, rows handed over without blocking, and the
//! trailer written and the file put in place at the end.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bmoe_output::PendingFile;
use crossbeam_channel::{bounded, Sender, TrySendError};

/// Capacity of the shutdown's reply channel: the writer's one "done".
const DONE_CAPACITY: usize = 1;

use super::actor::{run, Event};
use super::error::TelemetryError;
use super::row::{Row, COLUMNS};

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
    progress_failed: Arc<OnceLock<Arc<std::io::Error>>>,
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
        let (done_tx, done_rx) = bounded(DONE_CAPACITY);
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
