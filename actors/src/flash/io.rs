//! Reading expert slices from the model file: io_uring at a fixed queue depth,
//! O_DIRECT by default (straight into the slot when aligned, through a bounce
//! buffer when not), short reads completed, transient errors retried.

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use super::FlashError;

const ALIGN: u64 = 4096;
const MAX_RETRIES: u32 = 8;

/// One slice to read: `len` bytes at `file_offset` into `dst`.
#[derive(Debug, Clone, Copy)]
pub struct ReadOp {
    pub dst: *mut u8,
    pub file_offset: u64,
    pub len: u64,
}

// SAFETY: a ReadOp is a plain description; the destination's validity is the
// caller's contract on `SliceReader::read_all`.
unsafe impl Send for ReadOp {}

/// What one `read_all` cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadStats {
    /// Bytes the device delivered (page-rounded when a bounce buffer was used).
    pub device_bytes: u64,
    pub ops: u64,
    pub retries: u64,
    pub elapsed: Duration,
}

/// Reads slices into memory. Implementations: io_uring ([`UringReader`]),
/// plain pread ([`PreadReader`]); tests inject faults through this trait.
pub trait SliceReader: Send {
    /// Read every op completely before returning.
    ///
    /// # Safety
    /// Every `op.dst` must be valid for writes of `op.len` bytes and not read or
    /// written by anyone else until this returns.
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError>;
    /// Whether reads bypass the page cache.
    fn direct(&self) -> bool;
    /// A one-line description (kind, queue depth, direct or buffered).
    fn describe(&self) -> String;
}

/// A 4096-aligned heap buffer.
struct Bounce {
    ptr: *mut u8,
    layout: Layout,
}

impl Bounce {
    fn new(len: usize) -> Result<Self, FlashError> {
        let layout = Layout::from_size_align(len.max(ALIGN as usize), ALIGN as usize)
            .map_err(|e| FlashError::Config(format!("bounce buffer: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(FlashError::Config(format!(
                "cannot allocate a {len}-byte bounce buffer"
            )));
        }
        Ok(Self { ptr, layout })
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Open `path` for slice reads: O_DIRECT when asked and the filesystem allows it
/// (with a note when it falls back), io_uring when the kernel allows it (else pread).
pub fn open_reader(
    path: &Path,
    want_direct: bool,
    queue_depth: u32,
    max_slice_bytes: u64,
) -> Result<(Box<dyn SliceReader>, Vec<String>), FlashError> {
    let mut notes = Vec::new();
    let io_err = |source| FlashError::Open {
        path: path.to_path_buf(),
        source,
    };
    let (file, direct) = if want_direct {
        match open(path, true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                notes.push(format!(
                    "{}: the filesystem refuses O_DIRECT; reading through the page cache instead",
                    path.display()
                ));
                (open(path, false).map_err(io_err)?, false)
            }
            Err(e) => return Err(io_err(e)),
        }
    } else {
        (open(path, false).map_err(io_err)?, false)
    };
    let depth = queue_depth.clamp(1, 256);
    match UringReader::new(file, path.to_path_buf(), direct, depth, max_slice_bytes) {
        Ok(r) => Ok((Box::new(r), notes)),
        Err((file, e)) => {
            notes.push(format!("io_uring unavailable ({e}); using pread"));
            Ok((
                Box::new(PreadReader {
                    file: Box::new(file),
                    path: path.to_path_buf(),
                    direct,
                    bounce: Bounce::new((max_slice_bytes + 2 * ALIGN) as usize)?,
                }),
                notes,
            ))
        }
    }
}

fn aligned(op: &ReadOp) -> bool {
    (op.dst as u64) % ALIGN == 0 && op.file_offset % ALIGN == 0 && op.len % ALIGN == 0
}

/// The page-aligned file range (offset, length) that covers `op`, read into a
/// bounce buffer when the slice itself cannot be read with O_DIRECT.
fn covering_range(op: &ReadOp) -> (u64, u64) {
    let off = op.file_offset / ALIGN * ALIGN;
    let end = (op.file_offset + op.len).div_ceil(ALIGN) * ALIGN;
    (off, end - off)
}

/// The io_uring reader.
pub struct UringReader {
    ring: IoUring,
    file: File,
    path: PathBuf,
    direct: bool,
    depth: u32,
    bounces: Vec<Bounce>,
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
    fn new(
        file: File,
        path: PathBuf,
        direct: bool,
        depth: u32,
        max_slice_bytes: u64,
    ) -> Result<Self, (File, std::io::Error)> {
        let ring = match IoUring::new((depth * 2).next_power_of_two()) {
            Ok(r) => r,
            Err(e) => return Err((file, e)),
        };
        let mut bounces = Vec::new();
        if direct {
            for _ in 0..depth {
                match Bounce::new((max_slice_bytes + 2 * ALIGN) as usize) {
                    Ok(b) => bounces.push(b),
                    Err(e) => return Err((file, std::io::Error::other(e.to_string()))),
                }
            }
        }
        Ok(Self {
            ring,
            file,
            path,
            direct,
            depth,
            bounces,
        })
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
        let e = opcode::Read::new(types::Fd(self.file.as_raw_fd()), dst, len)
            .offset(f.off + f.done)
            .build()
            .user_data(slot as u64);
        // SAFETY: the destination stays valid and untouched until the completion
        // is reaped (read_all's contract for slots; bounce buffers are ours and
        // each is used by one flight at a time); the fd outlives the ring entries.
        unsafe {
            self.ring
                .submission()
                .push(&e)
                .map_err(|_| FlashError::Config("io_uring submission queue full".into()))?;
        }
        Ok(())
    }
}

impl SliceReader for UringReader {
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError> {
        let t0 = Instant::now();
        let mut stats = ReadStats {
            ops: ops.len() as u64,
            ..Default::default()
        };
        let depth = self.depth as usize;
        let mut flights: Vec<Option<Flight>> = vec![None; depth];
        let mut free_bounce: Vec<usize> = (0..self.bounces.len()).collect();
        let mut next = 0usize;
        let mut in_flight = 0usize;
        let trace = tracing::enabled!(tracing::Level::DEBUG);
        while next < ops.len() || in_flight > 0 {
            // Fill the queue.
            while in_flight < depth && next < ops.len() {
                let op = ops[next];
                let slot = flights.iter().position(|f| f.is_none()).expect("free slot");
                let f = if self.direct && !aligned(&op) {
                    let b = free_bounce.pop().expect("one bounce per slot");
                    let (off, len) = covering_range(&op);
                    Flight {
                        op: next,
                        bounce: Some(b),
                        off,
                        len,
                        done: 0,
                        retries: 0,
                        submitted: Instant::now(),
                    }
                } else {
                    Flight {
                        op: next,
                        bounce: None,
                        off: op.file_offset,
                        len: op.len,
                        done: 0,
                        retries: 0,
                        submitted: Instant::now(),
                    }
                };
                self.push(slot, &f, ops)?;
                flights[slot] = Some(f);
                in_flight += 1;
                next += 1;
            }
            self.ring.submit_and_wait(1).map_err(|e| FlashError::Read {
                path: self.path.clone(),
                offset: 0,
                source: e,
            })?;
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (slot, res) in done {
                let slot = slot as usize;
                let mut f = flights[slot].take().expect("completion for a known flight");
                let op = ops[f.op];
                if res < 0 {
                    let errno = -res;
                    if (errno == libc::EAGAIN || errno == libc::EINTR) && f.retries < MAX_RETRIES {
                        f.retries += 1;
                        stats.retries += 1;
                        self.push(slot, &f, ops)?;
                        flights[slot] = Some(f);
                        continue;
                    }
                    return Err(FlashError::Read {
                        path: self.path.clone(),
                        offset: f.off + f.done,
                        source: std::io::Error::from_raw_os_error(errno),
                    });
                }
                stats.device_bytes += res as u64;
                f.done += res as u64;
                // With a bounce, the tail page may run past the end of the file:
                // enough once the slice itself is covered.
                let needed = match f.bounce {
                    Some(_) => op.file_offset + op.len - f.off,
                    None => f.len,
                };
                if f.done < needed {
                    if res == 0 {
                        return Err(FlashError::ShortFile {
                            path: self.path.clone(),
                            offset: f.off + f.done,
                        });
                    }
                    // Short read: ask for the rest (a direct read whose progress is
                    // not aligned cannot continue in place).
                    if f.bounce.is_none() && self.direct && f.done % ALIGN != 0 {
                        return Err(FlashError::Read {
                            path: self.path.clone(),
                            offset: f.off + f.done,
                            source: std::io::Error::other("unaligned short O_DIRECT read"),
                        });
                    }
                    f.retries += 1;
                    stats.retries += 1;
                    self.push(slot, &f, ops)?;
                    flights[slot] = Some(f);
                    continue;
                }
                if let Some(b) = f.bounce {
                    let skip = (op.file_offset - f.off) as usize;
                    // SAFETY: the bounce holds `needed` >= skip + len valid bytes;
                    // `op.dst` is valid for `op.len` bytes (read_all's contract);
                    // the two buffers do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.bounces[b].ptr.add(skip),
                            op.dst,
                            op.len as usize,
                        )
                    };
                    free_bounce.push(b);
                }
                if trace {
                    trace_read(slot, &op, f.submitted, f.retries);
                }
                in_flight -= 1;
            }
        }
        stats.elapsed = t0.elapsed();
        Ok(stats)
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

/// Where a [`PreadReader`] gets its bytes: the model file, or a
/// fault-injecting wrapper ([`super::FaultySource`]) in tests.
pub trait RawSource: Send {
    /// Like `pread`: may return fewer bytes than asked, or fail.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

impl RawSource for File {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

/// Synchronous reader (the fallback when io_uring is not available, and the
/// reader under fault injection): short reads completed, EAGAIN/EINTR retried
/// at most `MAX_RETRIES` times in a row, anything else stops with the error.
pub struct PreadReader {
    file: Box<dyn RawSource>,
    path: PathBuf,
    direct: bool,
    bounce: Bounce,
}

impl PreadReader {
    /// A buffered (not O_DIRECT) reader over `source`, for slices up to `max_slice_bytes`.
    pub fn new(
        source: Box<dyn RawSource>,
        path: &Path,
        max_slice_bytes: u64,
    ) -> Result<Self, FlashError> {
        Ok(Self {
            file: source,
            path: path.to_path_buf(),
            direct: false,
            bounce: Bounce::new((max_slice_bytes + 2 * ALIGN) as usize)?,
        })
    }
}

// SAFETY: owned by the flash actor's thread only.
unsafe impl Send for PreadReader {}

impl SliceReader for PreadReader {
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError> {
        let t0 = Instant::now();
        let mut stats = ReadStats {
            ops: ops.len() as u64,
            ..Default::default()
        };
        for op in ops {
            let (off, len, bounce) = if self.direct && !aligned(op) {
                let (off, len) = covering_range(op);
                (off, len, true)
            } else {
                (op.file_offset, op.len, false)
            };
            let dst = if bounce { self.bounce.ptr } else { op.dst };
            // SAFETY: `dst` is valid for `len` bytes (the bounce holds max slice + 2
            // pages; the slot by read_all's contract).
            let buf = unsafe { std::slice::from_raw_parts_mut(dst, len as usize) };
            let mut done = 0usize;
            let needed = (op.file_offset + op.len - off) as usize;
            let mut retries = 0u32;
            while done < needed {
                match self.file.read_at(&mut buf[done..], off + done as u64) {
                    Ok(0) => {
                        return Err(FlashError::ShortFile {
                            path: self.path.clone(),
                            offset: off + done as u64,
                        })
                    }
                    Ok(n) => {
                        if done + n < needed {
                            stats.retries += 1; // a short read: ask for the rest
                        }
                        done += n;
                        stats.device_bytes += n as u64;
                        retries = 0;
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                        ) && retries < MAX_RETRIES =>
                    {
                        retries += 1;
                        stats.retries += 1;
                        std::thread::sleep(Duration::from_micros(50 << retries.min(6)));
                    }
                    Err(e) => {
                        return Err(FlashError::Read {
                            path: self.path.clone(),
                            offset: off + done as u64,
                            source: e,
                        })
                    }
                }
            }
            if bounce {
                // SAFETY: as in UringReader: bounce holds the covering range; dst is
                // valid for op.len bytes; no overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.bounce.ptr.add((op.file_offset - off) as usize),
                        op.dst,
                        op.len as usize,
                    )
                };
            }
        }
        stats.elapsed = t0.elapsed();
        Ok(stats)
    }

    fn direct(&self) -> bool {
        self.direct
    }

    fn describe(&self) -> String {
        format!(
            "pread {}",
            if self.direct { "O_DIRECT" } else { "buffered" }
        )
    }
}
