//! Reading expert slices from the model file: io_uring at a fixed queue depth
//! (see [`super::uring`]),
//! O_DIRECT by default (straight into the slot when aligned, through a bounce
//! buffer when not), short reads completed, transient errors retried.

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::FlashError;

pub(super) const ALIGN: u64 = 4096;
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

/// Reads slices into memory. Implementations: io_uring ([`super::uring::UringReader`]),
/// plain pread ([`PreadReader`]); tests inject faults through this trait.
pub trait SliceReader: Send {
    /// Read every op completely before returning.
    ///
    /// # Safety
    /// Every `op.dst` must be valid for writes of `op.len` bytes and not read or
    /// written by anyone else until this returns.
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError>;
    /// Reads that may still write into earlier destinations: 0 unless the
    /// reader broke down with reads in flight (then their memory must never be
    /// freed or reused).
    fn in_flight(&self) -> usize {
        0
    }
    /// Whether reads bypass the page cache.
    fn direct(&self) -> bool;
    /// A one-line description (kind, queue depth, direct or buffered).
    fn describe(&self) -> String;
}

/// A 4096-aligned heap buffer.
pub(super) struct Bounce {
    pub(super) ptr: *mut u8,
    layout: Layout,
}

impl Bounce {
    pub(super) fn new(len: usize) -> Result<Self, FlashError> {
        let layout =
            Layout::from_size_align(len.max(ALIGN as usize), ALIGN as usize).map_err(|_| {
                FlashError::Alloc {
                    what: "bounce buffer",
                    bytes: len as u64,
                }
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(FlashError::Alloc {
                what: "bounce buffer",
                bytes: len as u64,
            });
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

pub(super) fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

pub(super) fn aligned(op: &ReadOp) -> bool {
    (op.dst as u64) % ALIGN == 0 && op.file_offset % ALIGN == 0 && op.len % ALIGN == 0
}

/// The page-aligned file range (offset, length) that covers `op`, read into a
/// bounce buffer when the slice itself cannot be read with O_DIRECT.
pub(super) fn covering_range(op: &ReadOp) -> (u64, u64) {
    let off = op.file_offset / ALIGN * ALIGN;
    let end = (op.file_offset + op.len).div_ceil(ALIGN) * ALIGN;
    (off, end - off)
}

/// Where a [`PreadReader`] gets its bytes: the model file, or a
/// fault-injecting wrapper ([`super::fault::FaultySource`]) in tests.
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
        Self::over(source, path, false, max_slice_bytes)
    }

    /// A reader over `source` (opened with O_DIRECT when `direct`).
    pub(super) fn over(
        file: Box<dyn RawSource>,
        path: &Path,
        direct: bool,
        max_slice_bytes: u64,
    ) -> Result<Self, FlashError> {
        Ok(Self {
            file,
            path: path.to_path_buf(),
            direct,
            bounce: Bounce::new((max_slice_bytes + 2 * ALIGN) as usize)?,
        })
    }

    /// The fallback as `open_reader` builds it without io_uring: O_DIRECT on `path`.
    #[cfg(test)]
    pub(crate) fn open_direct(path: &Path, max_slice_bytes: u64) -> Result<Self, FlashError> {
        let file = open(path, true).map_err(|source| FlashError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::over(Box::new(file), path, true, max_slice_bytes)
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
