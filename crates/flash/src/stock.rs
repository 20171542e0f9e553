//! Pages faulted in ahead of the cache's growth: a background thread (the
//! toucher) keeps a few cells of a private anonymous region backed, and a miss
//! that fills a slot never used before takes a ready cell's pages (`mremap`)
//! instead of faulting each of its own in on the read's path.
//!
//! On a VM whose host takes free memory back (virtio-balloon free page
//! reporting) the first touch of a page costs the host's fault as well: 2.2
//! ms of CPU per MiB on this project's host after a minute idle, 4-5x a
//! recycled read (docs/benchmarks.md, "First touch"). The toucher pays it
//! while the engine computes.
//!
//! The ring is single-producer (the toucher fills cell `filled % n`) and
//! single-consumer (the flash actor takes cell `taken % n`): each side writes
//! only its own counter, and a cell belongs to the toucher while it lies in
//! `[filled, taken + n)` and to the actor while it lies in `[taken, filled)`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};

use super::arena::page_bytes;
use super::{counters::FlashCounters, error::FlashError};

/// Cells at most (a tiny fixture's slices would make thousands).
const MAX_CELLS: usize = 64;

/// Capacity of the toucher's channel: one wake-up waiting is enough.
const TOUCHER_CAPACITY: usize = 1;

/// Capacity of the shutdown's reply channel: the toucher's one "done".
const DONE_CAPACITY: usize = 1;

/// What the flash actor tells the toucher.
enum ToToucher {
    /// A cell was taken or the cache's room grew.
    Wake,
    /// Stop, then say so on `done`.
    Stop { done: Sender<()> },
}

/// The region and the ring's counters, shared by the actor and the toucher.
struct Shared {
    base: *mut u8,
    cell_bytes: usize,
    n_cells: usize,
    filled: AtomicUsize,
    taken: AtomicUsize,
    /// Bytes the cache may still grow by (budget less resident): the toucher
    /// keeps at most this much ready, so pages are never backed for nothing.
    room_bytes: AtomicU64,
    /// `pretouched_bytes`: what the toucher has backed, for the summary.
    counters: Arc<FlashCounters>,
}

// The region is written only by the toucher (zeros into the cells it backs)
// and the kernel (mremap out of the cells the actor takes), under the ring
// protocol above; the struct hands out addresses, never references.
// SAFETY: as the comment above says.
unsafe impl Send for Shared {}
// SAFETY: see Send: every field but `base` is atomic or immutable.
unsafe impl Sync for Shared {}

impl Shared {
    fn cell(&self, i: usize) -> *mut u8 {
        // SAFETY: i % n_cells < n_cells, so the cell lies inside the region.
        unsafe { self.base.add((i % self.n_cells) * self.cell_bytes) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: mapped in `Stock::new` with this length, unmapped once, after
        // both the actor (the owner) and the toucher (joined or exited) let go.
        unsafe { libc::munmap(self.base.cast(), self.n_cells * self.cell_bytes) };
    }
}

/// The actor's side: take ready cells, tell the toucher the room.
pub(crate) struct Stock {
    shared: Arc<Shared>,
    tx: Sender<ToToucher>,
    join: Option<JoinHandle<()>>,
}

/// A ready cell the actor holds until it gives it back with [`Stock::taken`].
pub(crate) struct Cell {
    pub(crate) addr: *mut u8,
    pub(crate) bytes: usize,
}

impl Stock {
    /// A stock of about `total_bytes` in cells of `cell_bytes` (a page
    /// multiple), and its toucher thread; None when `total_bytes` is 0.
    pub(crate) fn new(
        total_bytes: u64,
        cell_bytes: usize,
        counters: Arc<FlashCounters>,
    ) -> Result<Option<Self>, FlashError> {
        if total_bytes == 0 || cell_bytes == 0 {
            return Ok(None);
        }
        let n_cells = ((total_bytes as usize) / cell_bytes).clamp(2, MAX_CELLS);
        let len = n_cells * cell_bytes;
        // A private anonymous region of our own; no address hint, so no
        // existing memory is affected. MAP_NORESERVE: backed only when touched.
        // SAFETY: as the comment above says.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(FlashError::Os {
                what: format!("reserve {len} bytes for pages touched ahead"),
                source: std::io::Error::last_os_error(),
            });
        }
        let shared = Arc::new(Shared {
            base: p.cast(),
            cell_bytes,
            n_cells,
            filled: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            room_bytes: AtomicU64::new(0),
            counters,
        });
        let (tx, rx) = bounded(TOUCHER_CAPACITY);
        let s = shared.clone();
        let join = std::thread::Builder::new()
            .name("bmoe-toucher".into())
            .spawn(move || toucher(&s, &rx))
            .map_err(|e| FlashError::Os {
                what: "spawn the toucher thread".into(),
                source: e,
            })?;
        Ok(Some(Self {
            shared,
            tx,
            join: Some(join),
        }))
    }

    /// The bytes the cache may still grow by; wakes the toucher when they grew.
    pub(crate) fn set_room(&self, bytes: u64) {
        if self.shared.room_bytes.swap(bytes, Ordering::Relaxed) < bytes {
            self.wake();
        }
    }

    /// Whether the cache may still grow (the toucher works only then).
    pub(crate) fn has_room(&self) -> bool {
        self.shared.room_bytes.load(Ordering::Relaxed) > 0
    }

    /// The oldest ready cell, if the toucher has one.
    pub(crate) fn ready(&self) -> Option<Cell> {
        let t = self.shared.taken.load(Ordering::Relaxed);
        // Acquire: the toucher's populate of cell t happened before its
        // Release store of `filled` past t.
        let f = self.shared.filled.load(Ordering::Acquire);
        (t < f).then(|| Cell {
            addr: self.shared.cell(t),
            bytes: self.shared.cell_bytes,
        })
    }

    /// The cell [`Stock::ready`] gave is done with, its first `moved_bytes`
    /// (whole pages) moved out: what is left of it goes back to the kernel (a
    /// narrower slice than the cell holds no pages outside the cache's budget),
    /// and the cell to the toucher.
    pub(crate) fn taken(&self, moved_bytes: usize) {
        let t = self.shared.taken.load(Ordering::Relaxed);
        debug_assert!(t < self.shared.filled.load(Ordering::Acquire));
        let (addr, bytes) = (self.shared.cell(t), self.shared.cell_bytes);
        debug_assert_eq!(moved_bytes % page_bytes(), 0);
        if moved_bytes < bytes {
            // The cell is the actor's until the store below, and
            // [addr + moved, addr + bytes) whole pages of the stock's own
            // private anonymous region.
            // SAFETY: as the comment above says.
            unsafe {
                libc::madvise(
                    addr.add(moved_bytes) as *mut libc::c_void,
                    bytes - moved_bytes,
                    libc::MADV_DONTNEED,
                )
            };
        }
        // Release: the actor's mremap out of the cell happened before the
        // toucher may populate it again.
        self.shared.taken.store(t + 1, Ordering::Release);
        self.wake();
    }

    /// Cells the toucher has backed so far (each one once `filled` passes it).
    #[cfg(test)]
    pub(crate) fn touched_cells(&self) -> u64 {
        self.shared.filled.load(Ordering::Acquire) as u64
    }

    fn wake(&self) {
        match self.tx.try_send(ToToucher::Wake) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Stop the toucher: a message, then a join within `deadline` (one
    /// cell's populate at most). False when it did not stop in time.
    pub(crate) fn stop(&mut self, deadline: Duration) -> bool {
        let Some(join) = self.join.take() else {
            return true;
        };
        let t0 = Instant::now();
        let (done_tx, done_rx) = bounded::<()>(DONE_CAPACITY);
        if self
            .tx
            .send_timeout(ToToucher::Stop { done: done_tx }, deadline)
            .is_err()
        {
            return join.is_finished() && join.join().is_ok();
        }
        match done_rx.recv_timeout(deadline.saturating_sub(t0.elapsed())) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => join.join().is_ok(),
            Err(RecvTimeoutError::Timeout) => false,
        }
    }
}

impl Drop for Stock {
    fn drop(&mut self) {
        if !self.stop(Duration::from_secs(5)) {
            tracing::warn!("the toucher thread did not stop within 5 s");
        }
    }
}

/// The toucher's loop: back the next cell while there is room, else wait for
/// a wake-up (a cell taken, the room grown: never lost, since the one waiting
/// is kept); stop on [`ToToucher::Stop`] or when the actor is gone.
fn toucher(s: &Shared, rx: &Receiver<ToToucher>) {
    lower_priority();
    loop {
        let f = s.filled.load(Ordering::Relaxed);
        let t = s.taken.load(Ordering::Acquire);
        let ready_bytes = ((f - t) * s.cell_bytes) as u64;
        let work = f - t < s.n_cells && ready_bytes < s.room_bytes.load(Ordering::Relaxed);
        let msg = if work {
            populate(s.cell(f), s.cell_bytes);
            s.filled.store(f + 1, Ordering::Release);
            (s.counters.touch.pretouched_bytes).fetch_add(s.cell_bytes as u64, Ordering::Relaxed);
            rx.try_recv().ok()
        } else {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        };
        if let Some(ToToucher::Stop { done }) = msg {
            let _ = done.send(());
            return;
        }
    }
}

/// The toucher's nice value: it backs pages when a core is idle (the compute
/// waiting for a read, between tokens), not in the compute's place
/// (measured on the Qwen3 Q8_0 shape at auto: at nice 0 the compute lost
/// 55-75 ms a token to it; at 19 none, and the flash wait still fell from
/// 140 to 80 ms).
const TOUCHER_NICE: i32 = 19;

/// Give the calling thread (the toucher) [`TOUCHER_NICE`]; best effort (a
/// refusal leaves it at the process's own).
fn lower_priority() {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // On Linux PRIO_PROCESS with a thread id sets that thread's nice value;
    // lowering one's own priority needs no privilege.
    // SAFETY: plain syscall on our own thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, TOUCHER_NICE) };
    if rc != 0 {
        tracing::debug!(
            "toucher stays at the process's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Back every page of [addr, addr + len) (a cell the toucher owns) with a
/// write to each: each fault holds only the region's own lock for one page,
/// where `MADV_POPULATE_WRITE` would hold the process's mapping lock for the
/// whole cell (milliseconds on a VM whose host backs each page anew) and the
/// actor's `mremap` waits for it (measured: the flash wait grew by 100 ms a
/// token on the Qwen3 Q8_0 shape at auto).
fn populate(addr: *mut u8, len: usize) {
    let page = page_bytes();
    for off in (0..len).step_by(page) {
        // SAFETY: inside the cell (off < len), which the toucher owns; a
        // private anonymous page reads zero, so writing zero changes nothing.
        unsafe { std::ptr::write_volatile(addr.add(off), 0u8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::page_bytes as page;

    fn resident_pages(addr: *mut u8, len: usize) -> usize {
        let mut v = vec![0u8; len / page()];
        // SAFETY: whole pages of the stock's live region, a byte per page in v.
        let rc = unsafe { libc::mincore(addr.cast(), len, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v.iter().filter(|b| *b & 1 == 1).count()
    }

    fn wait_ready(s: &Stock, n: u64) {
        let t0 = Instant::now();
        while s.touched_cells() < n {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the toucher stalled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_toucher_backs_cells_only_within_the_room_and_refills_what_is_taken() {
        let cell = 4 * page();
        let counters = Arc::new(FlashCounters::default());
        let mut s = Stock::new((8 * cell) as u64, cell, counters.clone())
            .unwrap()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(s.ready().is_none(), "no room yet: nothing backed");
        s.set_room((3 * cell) as u64);
        wait_ready(&s, 3);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(s.touched_cells(), 3, "three cells of room, three cells");
        let backed = counters.touch.pretouched_bytes.load(Ordering::Relaxed);
        assert_eq!(backed, 3 * cell as u64, "counted");
        let c = s.ready().unwrap();
        assert_eq!((c.bytes, resident_pages(c.addr, c.bytes)), (cell, 4));
        s.set_room(0);
        s.taken(page());
        assert_eq!(
            resident_pages(c.addr, c.bytes),
            1,
            "a cell taken in part keeps only the part it gave (no room: not refilled)"
        );
        s.set_room((3 * cell) as u64);
        wait_ready(&s, 4);
        assert!(s.stop(Duration::from_secs(5)));
        assert!(s.stop(Duration::from_secs(5)), "stopping twice is fine");
    }

    #[test]
    fn no_bytes_no_stock() {
        let counters = Arc::new(FlashCounters::default());
        assert!(Stock::new(0, 4096, counters).unwrap().is_none());
    }
}
