//! The engine's own read-bandwidth probe: random expert-slice reads on the model
//! file through the same reader the flash actor uses, at a given queue depth.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{open_reader, FlashError, ReadOp};

/// One probe measurement.
#[derive(Debug, Clone)]
pub struct ProbeResult {
    pub queue_depth: u32,
    pub direct: bool,
    pub reads: u64,
    pub bytes: u64,
    pub elapsed: Duration,
}

impl ProbeResult {
    pub fn bytes_per_s(&self) -> f64 {
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.bytes as f64 / self.elapsed.as_secs_f64()
        }
    }
}

struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `probe_read_bandwidth`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Read randomly chosen `slices` (file offset, length) for about `duration`,
/// keeping `queue_depth` reads in flight. `seed` makes the choice reproducible.
/// `stop` is asked between batches of reads: true ends the probe early (the
/// result then covers what was read).
pub fn probe_read_bandwidth(
    path: &Path,
    slices: &[(u64, u64)],
    queue_depth: u32,
    o_direct: bool,
    duration: Duration,
    seed: u64,
    stop: &dyn Fn() -> bool,
) -> Result<ProbeResult, FlashError> {
    if slices.is_empty() {
        return Err(FlashError::Config("no slices to probe".into()));
    }
    let max = slices.iter().map(|s| s.1).max().unwrap_or(0);
    let (mut reader, _notes) = open_reader(path, o_direct, queue_depth, max)?;
    let batch = (queue_depth as usize * 4).max(4);
    let mut bufs = Vec::with_capacity(batch);
    for _ in 0..batch {
        let layout = std::alloc::Layout::from_size_align(max.max(4096) as usize, 4096)
            .map_err(|e| FlashError::Config(e.to_string()))?;
        // SAFETY: non-zero size layout; freed by Aligned's Drop.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(FlashError::Config("probe buffer allocation failed".into()));
        }
        bufs.push(Aligned { ptr, layout });
    }
    let mut rng = crate::xorshift::XorShift::new(seed);
    let mut next = || rng.next_u64();
    let mut res = ProbeResult {
        queue_depth,
        direct: reader.direct(),
        reads: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
    };
    let t0 = Instant::now();
    while t0.elapsed() < duration && !stop() {
        let ops: Vec<ReadOp> = bufs
            .iter()
            .map(|b| {
                let (off, len) = slices[(next() % slices.len() as u64) as usize];
                ReadOp {
                    dst: b.ptr,
                    file_offset: off,
                    len,
                }
            })
            .collect();
        // SAFETY: each op has its own buffer of at least `max` bytes, unused elsewhere.
        let s = unsafe { reader.read_all(&ops) }?;
        res.reads += ops.len() as u64;
        res.bytes += s.device_bytes;
    }
    res.elapsed = t0.elapsed();
    Ok(res)
}
