//! A memory balloon to emulate a smaller host: the bench maps N MiB of
//! anonymous memory, touches it page by page and holds it until the balloon
//! is dropped. These hosts have no swap, so touched anonymous pages cannot be
//! reclaimed and the page cache has to make do with what is left.
//!
//! Safety rails: while it holds the balloon the bench's `oom_score_adj` is
//! 1000 (the first process the OOM killer picks, before any run being
//! measured: each run starts at the bench's own value from before the
//! balloon, [`super::child`]); an OOM kill takes the bench, and its runs die
//! with it. Dropping the balloon unmaps the memory and puts the old
//! `oom_score_adj` back.

use std::time::Instant;

use bmoe_flash::AnonBuffer;

use super::{child, error::BenchError};

const MIB: u64 = 1024 * 1024;
const PAGE: usize = 4096;
/// The share of the balloon that must stay in memory for the limit to hold.
pub(crate) const HELD_SHARE: f64 = 0.9;
/// Where the kernel takes this process's OOM-killer bias.
const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";
/// A progress line every this many bytes touched.
const PROGRESS_BYTES: usize = 4096 * MIB as usize;

/// Held memory; dropping it deflates the balloon.
#[derive(Debug)]
pub struct Balloon {
    buf: AnonBuffer,
    /// `oom_score_adj` before the balloon raised it, put back on drop.
    restore_adj: String,
    pub mib: u64,
    pub(crate) inflate_s: f64,
}

impl Balloon {
    /// Map `mib` MiB, touch every page and hold them, with this process
    /// first in the OOM killer's line.
    pub fn inflate(mib: u64) -> Result<Self, BenchError> {
        let restore_adj = child::base_oom_score_adj()
            .ok_or_else(|| BenchError::Balloon(format!("cannot read {OOM_SCORE_ADJ}")))?
            .to_string();
        let len = usize::try_from(mib * MIB).map_err(|_| {
            BenchError::Balloon(format!("{mib} MiB does not fit this address space"))
        })?;
        std::fs::write(OOM_SCORE_ADJ, "1000")
            .map_err(|e| BenchError::Balloon(format!("cannot set oom_score_adj: {e}")))?;
        let t0 = Instant::now();
        let buf = match AnonBuffer::zeroed(len) {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::write(OOM_SCORE_ADJ, &restore_adj);
                return Err(BenchError::Balloon(format!("{mib} MiB: {e}")));
            }
        };
        touch(&buf);
        let inflate_s = t0.elapsed().as_secs_f64();
        crate::say!("balloon: holding {mib} MiB (touched in {inflate_s:.1} s, oom_score_adj 1000)");
        Ok(Self {
            buf,
            restore_adj,
            mib,
            inflate_s,
        })
    }

    /// Bytes of the balloon backed by memory now (`mincore`): all of them
    /// unless the kernel swapped some out. None when the kernel cannot say.
    pub fn resident_bytes(&self) -> Option<u64> {
        let len = self.buf.len();
        let mut pages = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: the buffer is one page-aligned mapping of `len` bytes, and
        // `pages` has one byte for each of its pages, as mincore(2) writes.
        let rc = unsafe { libc::mincore(self.buf.as_ptr().cast(), len, pages.as_mut_ptr()) };
        (rc == 0).then(|| pages.iter().filter(|&&p| p & 1 == 1).count() as u64 * PAGE as u64)
    }

    /// Whether at least [`HELD_SHARE`] of the balloon is still backed by
    /// memory (true when the kernel cannot say): on a host with swap the
    /// kernel may page it out, and the runs would no longer be under the limit.
    pub fn still_held(&self) -> bool {
        let size = self.buf.len() as f64;
        self.resident_bytes()
            .is_none_or(|r| r as f64 >= HELD_SHARE * size)
    }
}

/// Write one byte of every page of `buf`, so each is backed by memory.
fn touch(buf: &AnonBuffer) {
    let len = buf.len();
    for off in (0..len).step_by(PAGE) {
        // SAFETY: off < len = buf.len(): inside the mapping, which is writable
        // and owned by the balloon alone; a volatile write forces the page in.
        unsafe { std::ptr::write_volatile(buf.as_ptr().add(off), 1) };
        if off % PROGRESS_BYTES == 0 && off > 0 {
            crate::say!("balloon: {} MiB touched", off as u64 / MIB);
        }
    }
}

impl Drop for Balloon {
    fn drop(&mut self) {
        // Back to the old bias; the mapping is unmapped when `buf` drops.
        let _ = std::fs::write(OOM_SCORE_ADJ, &self.restore_adj);
    }
}

/// The balloon size that leaves about `limit_mib` MiB available, given the
/// current MemAvailable; `None` when memory is already at or below the limit.
pub(crate) fn size_for_limit(available_bytes: u64, limit_mib: u64) -> Option<u64> {
    let avail_mib = available_bytes / MIB;
    (avail_mib > limit_mib).then(|| avail_mib - limit_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balloon_size_leaves_the_limit() {
        assert_eq!(size_for_limit(24_000 * MIB, 1_600), Some(22_400));
        assert_eq!(size_for_limit(1_000 * MIB, 1_600), None);
        assert_eq!(size_for_limit(1_600 * MIB, 1_600), None);
    }
}
