//! The telemetry actor's thread: each row written to the CSV (flushed) and, with
//! `--progress`, as a `BMOE_PROGRESS` line on stdout; the trailer at the end.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::{Receiver, Sender};

use super::row::Row;

/// What the handle sends the actor.
pub(super) enum Event {
    Row(Row),
    End {
        trailer: Vec<(String, String)>,
        done: Sender<std::io::Result<()>>,
    },
}

/// The actor's loop; `progress` is where a failed progress line is recorded
/// (None: no progress lines).
pub(super) fn run(
    rx: Receiver<Event>,
    mut csv: Option<BufWriter<File>>,
    progress: Option<Arc<OnceLock<Arc<std::io::Error>>>>,
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
                        let _ = p.set(Arc::new(e));
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
