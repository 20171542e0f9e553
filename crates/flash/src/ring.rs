//! The submission and completion queues the io_uring reader drives: the
//! [`Ring`] trait and the kernel's io_uring behind it ([`KernelRing`]).

use std::fs::File;
use std::os::fd::AsRawFd;

use io_uring::{opcode, types, IoUring};

/// The submission and completion queues a [`super::uring::UringReader`] drives.
pub trait Ring: Send {
    /// Queue a read of `len` bytes at `offset` into `dst`, tagged `tag`.
    /// Returns false when the submission queue is full (the reader then
    /// submits, waits for a completion and pushes again).
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

    /// The file back (a reader that could not be built gives it back).
    pub(super) fn into_file(self) -> File {
        self.file
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
