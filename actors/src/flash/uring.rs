//! The io_uring reader: slices read at a fixed queue depth through a [`Ring`]
//! (the kernel's io_uring, or a fault-injecting test ring).
//!
//! Invariant: `read_all` never returns while a read it submitted is still in
//! flight. On the first error it stops submitting and drains every outstanding
//! completion before returning, so no kernel write can land in a destination
//! after the caller has taken it back. Completions carry the call's generation
//! in their tag, so one from an earlier call can never be credited to a later
//! read.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use super::io::{aligned, covering_range, Bounce, ReadOp, ReadStats, SliceReader, ALIGN};
use super::FlashError;

const MAX_RETRIES: u32 = 8;
/// Failed waits in a row (EINTR, EAGAIN, EBUSY, ...) before the ring is given up as wedged.
const MAX_WAIT_FAILURES: u32 = 10_000;

/// The submission and completion queues a [`UringReader`] drives.
pub trait Ring: Send {
    /// Queue a read of `len` bytes at `offset` into `dst`, tagged `tag`.
    /// Returns false when the submission queue is full.
    ///
    /// # Safety
    /// `dst` must stay valid for writes of `len` bytes, and untouched by anyone
    /// else, until the completion tagged `tag` has been reaped.
    unsafe fn push_read(&mut self, dst: *mut u8, len: u32, offset: u64, tag: u64) -> bool;
    /// Submit what was queued and wait until at least `want` completions are ready.
    fn submit_and_wait(&mut self, want: usize) -> std::io::Result<()>;
    /// Move the ready completions, `(tag, result)` (bytes, or a negated errno), to `out`.
    fn reap(&mut self, out: &mut Vec<(u64, i32)>);
}

/// The kernel's io_uring over one file.
pub struct KernelRing {
    ring: IoUring,
    file: File,
}

impl KernelRing {
    /// A ring with room for `entries` submissions (rounded up to a power of two).
    pub fn new(file: File, entries: u32) -> Result<Self, (File, std::io::Error)> {
        match IoUring::new(entries.next_power_of_two()) {
            Ok(ring) => Ok(Self { ring, file }),
            Err(e) => Err((file, e)),
        }
    }
}

impl Ring for KernelRing {
    unsafe fn push_read(&mut self, dst: *mut u8, len: u32, offset: u64, tag: u64) -> bool {
        let e = opcode::Read::new(types::Fd(self.file.as_raw_fd()), dst, len)
            .offset(offset)
            .build()
            .user_data(tag);
        // SAFETY: the destination's validity until the completion is reaped is
        // this function's contract; the fd lives as long as the ring (both ours).
        unsafe { self.ring.submission().push(&e).is_ok() }
    }

    fn submit_and_wait(&mut self, want: usize) -> std::io::Result<()> {
        self.ring.submit_and_wait(want).map(|_| ())
    }

    fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }
}

/// The io_uring reader.
pub struct UringReader {
    ring: Box<dyn Ring>,
    path: PathBuf,
    direct: bool,
    depth: u32,
    bounces: Vec<Bounce>,
    /// Tags the completions of one `read_all` call (upper 32 bits of the tag).
    generation: u32,
    /// Completions whose tag named no read of the current call (ignored).
    stale: u64,
    /// Reads left in flight by a ring that stopped answering (then every call
    /// fails, and their destinations and bounce buffers are never freed).
    wedged: usize,
}

// SAFETY: the ring and the bounce buffers are owned by this value and used only
// by the thread that holds it (the flash actor).
unsafe impl Send for UringReader {}

/// One read in flight.
#[derive(Clone, Copy)]
struct Flight {
    op: usize,
    /// Read target: the slot itself, or a bounce buffer (index).
    bounce: Option<usize>,
    /// File offset and length of the whole read (page-rounded with a bounce).
    off: u64,
    len: u64,
    done: u64,
    retries: u32,
    /// When the read was first submitted (for the per-read trace event).
    submitted: Instant,
}

/// One completed read as a trace event: the Chrome layer draws it from
/// submission to completion on the track of its queue slot.
fn trace_read(slot: usize, op: &ReadOp, submitted: Instant, retries: u32) {
    let elapsed_us = submitted.elapsed().as_nanos() as f64 / 1000.0;
    tracing::debug!(
        span = "flash.read_op",
        track = slot as u64,
        elapsed_us,
        offset = op.file_offset,
        bytes = op.len,
        retries,
        "read complete"
    );
}

impl UringReader {
    /// A reader on the kernel's io_uring over `file`; gives the file back when
    /// the kernel refuses a ring.
    pub fn new(
        file: File,
        path: PathBuf,
        direct: bool,
        depth: u32,
        max_slice_bytes: u64,
    ) -> Result<Self, (File, std::io::Error)> {
        let ring = KernelRing::new(file, depth * 2)?;
        Self::with_ring(Box::new(ring), path, direct, depth, max_slice_bytes)
            .map_err(|(ring, e)| (ring.file, e))
    }

    /// A reader over any ring (tests: [`super::FaultyRing`]).
    pub fn with_ring<R: Ring + 'static>(
        ring: Box<R>,
        path: PathBuf,
        direct: bool,
        depth: u32,
        max_slice_bytes: u64,
    ) -> Result<Self, (Box<R>, std::io::Error)> {
        let mut bounces = Vec::new();
        if direct {
            for _ in 0..depth {
                match Bounce::new((max_slice_bytes + 2 * ALIGN) as usize) {
                    Ok(b) => bounces.push(b),
                    Err(e) => return Err((ring, std::io::Error::other(e.to_string()))),
                }
            }
        }
        Ok(Self {
            ring,
            path,
            direct,
            depth,
            bounces,
            generation: 0,
            stale: 0,
            wedged: 0,
        })
    }

    /// Completions ignored because their tag named no read of the call that reaped them.
    pub fn stale_completions(&self) -> u64 {
        self.stale
    }

    fn tag(&self, slot: usize) -> u64 {
        (u64::from(self.generation) << 32) | slot as u64
    }

    /// The slot a completion's tag names, when it belongs to the current call.
    fn slot_of(&self, tag: u64) -> Option<usize> {
        ((tag >> 32) as u32 == self.generation).then_some((tag & 0xffff_ffff) as usize)
    }

    /// Queue the (rest of the) read described by `f` as entry `slot`.
    fn push(&mut self, slot: usize, f: &Flight, ops: &[ReadOp]) -> Result<(), FlashError> {
        let dst = match f.bounce {
            // SAFETY: done < len <= the bounce buffer's size.
            Some(b) => unsafe { self.bounces[b].ptr.add(f.done as usize) },
            // SAFETY: done < len == op.len, inside the caller's destination.
            None => unsafe { ops[f.op].dst.add(f.done as usize) },
        };
        let len = (f.len - f.done) as u32;
        // SAFETY: the destination stays valid and untouched until the completion
        // is reaped (read_all's contract for slots; bounce buffers are ours and
        // each is used by one flight at a time).
        if unsafe {
            self.ring
                .push_read(dst, len, f.off + f.done, self.tag(slot))
        } {
            Ok(())
        } else {
            Err(FlashError::Config("io_uring submission queue full".into()))
        }
    }
}

/// The state of one `read_all` call.
struct Call<'a> {
    ops: &'a [ReadOp],
    /// Per queue slot: the read it carries.
    flights: Vec<Option<Flight>>,
    free_bounce: Vec<usize>,
    /// The next op to submit.
    next: usize,
    in_flight: usize,
    /// The first failure: nothing more is submitted, what is in flight drains.
    error: Option<FlashError>,
    stats: ReadStats,
    trace: bool,
}

impl<'a> Call<'a> {
    fn new(ops: &'a [ReadOp], depth: usize, bounces: usize) -> Self {
        Self {
            ops,
            flights: vec![None; depth],
            free_bounce: (0..bounces).collect(),
            next: 0,
            in_flight: 0,
            error: None,
            stats: ReadStats {
                ops: ops.len() as u64,
                ..Default::default()
            },
            trace: tracing::enabled!(tracing::Level::DEBUG),
        }
    }

    /// Keep the first failure (later ones are its consequences).
    fn fail(&mut self, e: FlashError) {
        self.error.get_or_insert(e);
    }

    /// A flight is over (served or failed): its slot and bounce are free again.
    fn retire(&mut self, f: &Flight) {
        if let Some(b) = f.bounce {
            self.free_bounce.push(b);
        }
        self.in_flight -= 1;
    }
}

fn transient(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EINTR | libc::EBUSY)
}

impl UringReader {
    /// Submit ops until the queue is full or none is left.
    fn fill(&mut self, call: &mut Call<'_>) {
        while call.in_flight < call.flights.len() && call.next < call.ops.len() {
            let op = call.ops[call.next];
            let Some(slot) = call.flights.iter().position(|f| f.is_none()) else {
                break;
            };
            let (bounce, off, len) = if self.direct && !aligned(&op) {
                let Some(b) = call.free_bounce.pop() else {
                    break;
                };
                let (off, len) = covering_range(&op);
                (Some(b), off, len)
            } else {
                (None, op.file_offset, op.len)
            };
            let f = Flight {
                op: call.next,
                bounce,
                off,
                len,
                done: 0,
                retries: 0,
                submitted: Instant::now(),
            };
            if let Err(e) = self.push(slot, &f, call.ops) {
                if let Some(b) = bounce {
                    call.free_bounce.push(b);
                }
                call.fail(e);
                return;
            }
            call.flights[slot] = Some(f);
            call.in_flight += 1;
            call.next += 1;
        }
    }

    /// Submit and wait for a completion; interrupted or busy waits are retried
    /// (they say nothing about the reads). Err only when the ring stops answering.
    fn wait(&mut self, stats: &mut ReadStats) -> Result<(), FlashError> {
        let mut failures = 0u32;
        loop {
            let e = match self.ring.submit_and_wait(1) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            failures += 1;
            stats.retries += 1;
            let errno = e.raw_os_error().unwrap_or(0);
            if failures >= MAX_WAIT_FAILURES || (!transient(errno) && failures > MAX_RETRIES) {
                return Err(FlashError::Wedged {
                    path: self.path.clone(),
                    source: e,
                });
            }
            if errno != libc::EINTR {
                std::thread::sleep(Duration::from_micros(50 << failures.min(6)));
            }
        }
    }

    fn wedged_error(&self, what: &str) -> FlashError {
        FlashError::Wedged {
            path: self.path.clone(),
            source: std::io::Error::other(format!("{what}; {} reads never completed", self.wedged)),
        }
    }

    /// Account one completion: retry it, ask for the rest, finish it, or fail the call.
    fn settle(&mut self, call: &mut Call<'_>, tag: u64, res: i32) {
        let Some(slot) = self.slot_of(tag).filter(|&s| s < call.flights.len()) else {
            self.stale += 1;
            tracing::warn!(tag, "io_uring completion of no current read ignored");
            return;
        };
        let Some(mut f) = call.flights[slot].take() else {
            self.stale += 1;
            tracing::warn!(tag, "io_uring completion for an idle slot ignored");
            return;
        };
        let op = call.ops[f.op];
        let outcome = self.progress(&mut f, &op, res, &mut call.stats);
        match outcome {
            // Draining after a failure: nothing is resubmitted.
            Progress::More if call.error.is_some() => call.retire(&f),
            Progress::More => match self.push(slot, &f, call.ops) {
                Ok(()) => call.flights[slot] = Some(f),
                Err(e) => {
                    call.retire(&f);
                    call.fail(e);
                }
            },
            Progress::Failed(e) => {
                call.retire(&f);
                call.fail(e);
            }
            Progress::Done => {
                if call.error.is_none() {
                    self.deliver(&f, &op);
                }
                if call.trace {
                    trace_read(slot, &op, f.submitted, f.retries);
                }
                call.retire(&f);
            }
        }
    }

    /// What one completion means for its flight.
    fn progress(&self, f: &mut Flight, op: &ReadOp, res: i32, stats: &mut ReadStats) -> Progress {
        let at = f.off + f.done;
        if res < 0 {
            let errno = -res;
            if transient(errno) && f.retries < MAX_RETRIES {
                f.retries += 1;
                stats.retries += 1;
                return Progress::More;
            }
            return Progress::Failed(self.read_error(at, std::io::Error::from_raw_os_error(errno)));
        }
        stats.device_bytes += res as u64;
        f.done += res as u64;
        // With a bounce, the tail page may run past the end of the file:
        // enough once the slice itself is covered.
        let needed = match f.bounce {
            Some(_) => op.file_offset + op.len - f.off,
            None => f.len,
        };
        if f.done >= needed {
            return Progress::Done;
        }
        if res == 0 {
            return Progress::Failed(FlashError::ShortFile {
                path: self.path.clone(),
                offset: f.off + f.done,
            });
        }
        // A direct read whose progress is not aligned cannot continue in place.
        if f.bounce.is_none() && self.direct && f.done % ALIGN != 0 {
            let e = std::io::Error::other("unaligned short O_DIRECT read");
            return Progress::Failed(self.read_error(f.off + f.done, e));
        }
        f.retries += 1;
        stats.retries += 1;
        Progress::More
    }

    fn read_error(&self, offset: u64, source: std::io::Error) -> FlashError {
        FlashError::Read {
            path: self.path.clone(),
            offset,
            source,
        }
    }

    /// Copy a bounced read into its destination.
    fn deliver(&self, f: &Flight, op: &ReadOp) {
        if let Some(b) = f.bounce {
            let skip = (op.file_offset - f.off) as usize;
            // SAFETY: the bounce holds >= skip + len valid bytes (the read is done);
            // `op.dst` is valid for `op.len` bytes (read_all's contract); the two
            // buffers do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.bounces[b].ptr.add(skip),
                    op.dst,
                    op.len as usize,
                )
            };
        }
    }
}

/// What one completion left of its read.
enum Progress {
    /// Submit the rest (or the whole read again).
    More,
    Done,
    Failed(FlashError),
}

impl Drop for UringReader {
    fn drop(&mut self) {
        if self.wedged > 0 {
            // The kernel may still write into the bounce buffers: never free them.
            std::mem::forget(std::mem::take(&mut self.bounces));
        }
    }
}

impl SliceReader for UringReader {
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError> {
        if self.wedged > 0 {
            return Err(self.wedged_error("an earlier wait failed"));
        }
        let t0 = Instant::now();
        self.generation = self.generation.wrapping_add(1);
        let mut call = Call::new(ops, self.depth as usize, self.bounces.len());
        let mut done = Vec::new();
        // Submit while nothing failed; after a failure only drain what is in flight.
        while (call.error.is_none() && call.next < ops.len()) || call.in_flight > 0 {
            if call.error.is_none() {
                self.fill(&mut call);
            }
            if call.in_flight == 0 {
                break;
            }
            if let Err(e) = self.wait(&mut call.stats) {
                self.wedged = call.in_flight;
                return Err(e);
            }
            done.clear();
            self.ring.reap(&mut done);
            for &(tag, res) in &done {
                self.settle(&mut call, tag, res);
            }
        }
        debug_assert_eq!(call.in_flight, 0, "read_all returns with nothing in flight");
        if let Some(e) = call.error {
            return Err(e);
        }
        let mut stats = call.stats;
        stats.elapsed = t0.elapsed();
        Ok(stats)
    }

    fn in_flight(&self) -> usize {
        self.wedged
    }

    fn direct(&self) -> bool {
        self.direct
    }

    fn describe(&self) -> String {
        format!(
            "io_uring depth {} {}",
            self.depth,
            if self.direct { "O_DIRECT" } else { "buffered" }
        )
    }
}
