//! The engine's own read-bandwidth probe: random expert-slice reads on the model
//! file through the same reader the flash actor uses, at a given queue depth.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{error::FlashError, io::ReadOp, open::open_reader};

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

/// Which slice the probe reads next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOrder {
    /// Uniformly drawn from the list (the seed makes it reproducible).
    Random { seed: u64 },
    /// The list in order, from the start again at its end: a recorded read
    /// sequence, with its re-reads as close together as the run had them.
    InOrder,
}

/// How a probe reads: reads kept in flight, and whether past the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSettings {
    pub queue_depth: u32,
    pub o_direct: bool,
}

/// Read `slices` (file offset, length) in `order` for about `duration`,
/// keeping `queue_depth` reads in flight. `stop` is asked between batches of
/// reads: true ends the probe early (the result then covers what was read).
pub fn probe_read_bandwidth(
    path: &Path,
    slices: &[(u64, u64)],
    reads: ReadSettings,
    duration: Duration,
    order: ProbeOrder,
    stop: &dyn Fn() -> bool,
) -> Result<ProbeResult, FlashError> {
    let ReadSettings {
        queue_depth,
        o_direct,
    } = reads;
    if slices.is_empty() {
        return Err(FlashError::NoSlices);
    }
    let max = slices.iter().map(|s| s.1).max().unwrap_or(0);
    let (mut reader, _notes) = open_reader(path, o_direct, queue_depth, max)?;
    let batch = (queue_depth as usize * 4).max(4);
    let mut bufs = Vec::with_capacity(batch);
    for _ in 0..batch {
        let alloc_err = FlashError::Alloc {
            what: "probe buffer",
            bytes: max.max(4096),
        };
        let layout = std::alloc::Layout::from_size_align(max.max(4096) as usize, 4096)
            .map_err(|_| alloc_err)?;
        // SAFETY: non-zero size layout; freed by Aligned's Drop.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(FlashError::Alloc {
                what: "probe buffer",
                bytes: max.max(4096),
            });
        }
        bufs.push(Aligned { ptr, layout });
    }
    let mut next = picks(order, slices.len());
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
                let (off, len) = slices[next()];
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

/// The indices into a list of `n` slices that `order` reads, one per call.
fn picks(order: ProbeOrder, n: usize) -> impl FnMut() -> usize {
    let mut rng = crate::xorshift::XorShift::new(match order {
        ProbeOrder::Random { seed } => seed,
        ProbeOrder::InOrder => 0,
    });
    let mut at = 0usize;
    move || match order {
        ProbeOrder::Random { .. } => (rng.next_u64() % n as u64) as usize,
        ProbeOrder::InOrder => {
            let i = at;
            at = (at + 1) % n;
            i
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_replays_the_list_and_random_stays_in_it() {
        let mut next = picks(ProbeOrder::InOrder, 3);
        let v: Vec<usize> = (0..7).map(|_| next()).collect();
        assert_eq!(v, [0, 1, 2, 0, 1, 2, 0]);
        let mut next = picks(ProbeOrder::Random { seed: 7 }, 5);
        let v: Vec<usize> = (0..200).map(|_| next()).collect();
        assert!(v.iter().all(|&i| i < 5));
        assert!((0..5).all(|i| v.contains(&i)), "every slice drawn");
    }
}
