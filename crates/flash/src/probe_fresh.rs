//! Reads into memory never touched before: what a cache that is still
//! filling costs (each slot's pages are faulted in by the read itself),
//! unlike reads into recycled slots ([`super::probe::probe_read_bandwidth`]).

use std::path::Path;
use std::time::Instant;

use super::{error::FlashError, io::ReadOp, open::open_reader, probe::ProbeResult};

/// A fresh anonymous mapping, unmapped when dropped.
struct Fresh {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `probe_fresh_reads`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Read `slices` in list order into `total_bytes` of a fresh anonymous
/// mapping (each read to the next 4096-aligned place), `queue_depth` reads in
/// flight, until the mapping is full.
pub fn probe_fresh_reads(
    path: &Path,
    slices: &[(u64, u64)],
    reads: super::probe::ReadSettings,
    total_bytes: u64,
) -> Result<ProbeResult, FlashError> {
    let super::probe::ReadSettings {
        queue_depth,
        o_direct,
    } = reads;
    let max = slices.iter().map(|s| s.1).max().unwrap_or(0);
    if slices.is_empty() || max == 0 {
        return Err(FlashError::NoSlices);
    }
    let len = total_bytes.max(max).next_multiple_of(4096) as usize;
    // SAFETY: a private anonymous mapping of `len` bytes, nothing populated.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(FlashError::Alloc {
            what: "probe mapping",
            bytes: len as u64,
        });
    }
    let fresh = Fresh {
        ptr: ptr.cast(),
        len,
    };
    let (mut reader, _notes) = open_reader(path, o_direct, queue_depth, max)?;
    let mut res = ProbeResult {
        queue_depth,
        direct: reader.direct(),
        reads: 0,
        bytes: 0,
        elapsed: Default::default(),
    };
    let (mut at, mut next) = (0usize, 0usize);
    let t0 = Instant::now();
    loop {
        let mut ops = Vec::new();
        while ops.len() < queue_depth.max(1) as usize * 4 {
            let (off, n) = slices[next % slices.len()];
            if at + n as usize > fresh.len {
                break;
            }
            // SAFETY: `at + n` is inside the mapping (checked above).
            let dst = unsafe { fresh.ptr.add(at) };
            ops.push(ReadOp {
                dst,
                file_offset: off,
                len: n,
            });
            at += (n as usize).next_multiple_of(4096);
            next += 1;
        }
        if ops.is_empty() {
            break;
        }
        // SAFETY: each op writes its own range of the mapping, which outlives the call.
        let s = match unsafe { reader.read_all(&ops) } {
            Ok(s) => s,
            Err(e) => {
                if reader.in_flight() > 0 {
                    // Reads may still land in the mapping: never unmap it.
                    std::mem::forget(fresh);
                }
                return Err(e);
            }
        };
        res.reads += ops.len() as u64;
        res.bytes += s.device_bytes;
    }
    res.elapsed = t0.elapsed();
    Ok(res)
}
