//! The io_uring reader: slices read at a fixed queue depth through a [`Ring`]
//! (the kernel's io_uring, or a fault-injecting test ring).
//!
//! Invariant: `read_all` never returns while a read it submitted is still in
//! flight. On the first error it stops submitting and drains every outstanding
//! completion before returning, so no kernel write can land in a destination
//! after the caller has taken it back. Completions carry the call's generation
//! in their tag, so one from an earlier call can never be credited to a later
//! read. A full submission queue is not an error: the read waits until the
//! next completion makes room (the ring may hold fewer entries than the depth).

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::FlashError;
use super::io::{aligned, covering_range, Bounce, ReadOp, ReadStats, SliceReader, ALIGN};
use super::ring::{KernelRing, Ring};

mod call;
use call::{Call, Flight};

const MAX_RETRIES: u32 = 8;
/// Failed waits in a row (EINTR, EAGAIN, EBUSY, ...) before the ring is given up as wedged.
const MAX_WAIT_FAILURES: u32 = 10_000;

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
            .map_err(|(ring, e)| (ring.into_file(), e))
    }

    /// A reader over any ring (tests: [`super::fault::FaultyRing`]).
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

    /// Queue the (rest of the) read described by `f` as entry `slot`; false
    /// when the submission queue is full (nothing was queued).
    fn push(&mut self, slot: usize, f: &Flight, ops: &[ReadOp]) -> bool {
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
        unsafe {
            self.ring
                .push_read(dst, len, f.off + f.done, self.tag(slot))
        }
    }

    /// Push the flight in `slot`, or queue it behind the others waiting for
    /// room in a full submission queue.
    fn push_or_wait(&mut self, call: &mut Call<'_>, slot: usize) {
        let pushed = call.unsent.is_empty()
            && call.flights[slot].is_some_and(|f| self.push(slot, &f, call.ops));
        if !pushed {
            call.unsent.push_back(slot);
        }
    }

    /// Push the flights that waited for room, oldest first; false while the
    /// queue is still full.
    fn push_unsent(&mut self, call: &mut Call<'_>) -> bool {
        while let Some(&slot) = call.unsent.front() {
            let Some(f) = call.flights[slot] else {
                call.unsent.pop_front();
                continue;
            };
            if !self.push(slot, &f, call.ops) {
                return false;
            }
            call.unsent.pop_front();
        }
        true
    }
}

fn transient(errno: i32) -> bool {
    matches!(errno, libc::EAGAIN | libc::EINTR | libc::EBUSY)
}

impl UringReader {
    /// Push the flights that waited for room, then new ops, until every slot
    /// is taken, the submission queue is full or no op is left.
    fn fill(&mut self, call: &mut Call<'_>) {
        if !self.push_unsent(call) {
            return;
        }
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
            call.flights[slot] = Some(Flight {
                op: call.next,
                bounce,
                off,
                len,
                done: 0,
                retries: 0,
                submitted: Instant::now(),
            });
            call.in_flight += 1;
            call.next += 1;
            self.push_or_wait(call, slot);
            if !call.unsent.is_empty() {
                // The queue is full: the next completion makes room.
                return;
            }
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
            Progress::More => {
                call.flights[slot] = Some(f);
                self.push_or_wait(call, slot);
            }
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
        // O_DIRECT moves whole blocks except where the file ends: a direct read
        // whose progress is not aligned reached the end of the file too.
        let unaligned_end = f.bounce.is_none() && self.direct && f.done % ALIGN != 0;
        if res == 0 || unaligned_end {
            return Progress::Failed(FlashError::ShortFile {
                path: self.path.clone(),
                offset: f.off + f.done,
            });
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
            } else {
                call.drop_unsent();
            }
            if call.in_flight == 0 {
                break;
            }
            if call.in_ring() == 0 {
                // A full queue that holds nothing: no completion will make room.
                call.fail(FlashError::RingTakesNoReads);
                call.drop_unsent();
                break;
            }
            // Submit and wait for a completion (with a full queue: room for
            // the flights waiting in `unsent`).
            if let Err(e) = self.wait(&mut call.stats) {
                self.wedged = call.in_ring();
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
