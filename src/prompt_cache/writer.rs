//! The background writer: entries to disk one at a time from a bounded
//! queue (a full queue drops the write: a reply never waits on the disk),
//! each written beside its place and renamed into it after making room under
//! the cap; stopped by a message, then joined within a deadline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use super::disk::{self, DiskIndex};
use super::entry;
use super::hit::Stats;
use super::ident::Ident;

/// Capacity of the shutdown's reply channel: the writer's one "done".
const DONE_CAPACITY: usize = 1;

/// Entries that may wait for the writer; more are dropped with a note.
pub(super) const WRITE_QUEUE_CAPACITY: usize = 2;

pub(super) struct WriteJob {
    pub(super) ident: Ident,
    /// The folder of its scope (made and marked on first use).
    pub(super) dir: PathBuf,
    pub(super) tokens: Arc<[i32]>,
    pub(super) state: Arc<Vec<u8>>,
    pub(super) stats: Arc<Stats>,
}

enum Msg {
    Write(WriteJob),
    /// Stop, and say so on the one-shot channel once every queued write is done.
    Stop(Sender<()>),
}

pub(super) struct Writer {
    tx: Sender<Msg>,
    handle: JoinHandle<()>,
}

impl Writer {
    /// Start the thread writing into folders under `root`, within its cap.
    pub(super) fn start(root: PathBuf, cap_bytes: u64) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded(WRITE_QUEUE_CAPACITY);
        let handle = std::thread::Builder::new()
            .name("bmoe-pcache-writer".into())
            .spawn(move || run(&rx, root, cap_bytes))?;
        Ok(Self { tx, handle })
    }

    /// Queue a write; dropped (with a debug note) when the queue is full.
    pub(super) fn submit(&self, job: WriteJob) {
        match self.tx.try_send(Msg::Write(job)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::debug!("prompt cache: the writer is busy, this state is kept in RAM only")
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!(
                    "prompt cache: the writer thread has ended; nothing more is written to disk"
                )
            }
        }
    }

    /// The shutdown message, then the join, within `deadline`.
    pub(super) fn stop(self, deadline: Duration) -> bool {
        let t0 = Instant::now();
        let (done_tx, done_rx) = crossbeam_channel::bounded(DONE_CAPACITY);
        if self.tx.send_timeout(Msg::Stop(done_tx), deadline).is_err() {
            return false;
        }
        match done_rx.recv_timeout(deadline.saturating_sub(t0.elapsed())) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => self.handle.join().is_ok(),
            Err(RecvTimeoutError::Timeout) => false,
        }
    }
}

fn run(rx: &Receiver<Msg>, root: PathBuf, cap_bytes: u64) {
    let mut indexes: HashMap<PathBuf, DiskIndex> = HashMap::new();
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Write(job) => {
                if let Err(e) = super::owned::make_folder(&job.dir) {
                    tracing::warn!(
                        "prompt cache {}: {e}: this state is kept in RAM only",
                        job.dir.display()
                    );
                    continue;
                }
                let index = indexes
                    .entry(job.dir.clone())
                    .or_insert_with(|| DiskIndex::quiet(job.dir.clone()));
                write(&root, index, cap_bytes, &job)
            }
            Msg::Stop(done) => {
                let _ = done.send(());
                return;
            }
        }
    }
}

/// One entry to disk: skipped when a file already covers its tokens, the
/// shorter prefixes it covers removed, room made under the cap; a failure
/// (a full disk) is a warning.
fn write(root: &Path, index: &mut DiskIndex, cap_bytes: u64, job: &WriteJob) {
    index.refresh(&job.ident);
    if index.covers(&job.tokens) {
        return;
    }
    let path = index.path_of(&job.tokens);
    let bytes = entry::head(&job.ident, &job.tokens, 0).len() as u64 + job.state.len() as u64 + 4;
    index.remove_covered_by(&job.tokens);
    if !disk::make_room(root, cap_bytes, bytes) {
        tracing::warn!(
            "prompt cache: a state of {bytes} bytes does not fit under the cap of {cap_bytes} bytes in {}: kept in RAM only (raise --prompt-cache-mb)",
            root.display()
        );
        return;
    }
    match entry::write_entry(&path, &job.ident, &job.tokens, &job.state) {
        Ok(n) => {
            job.stats.written_bytes.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => tracing::warn!("{e}: this state is kept in RAM only"),
    }
}
