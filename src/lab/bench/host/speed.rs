//! The host's speed sampled beside a run: a CPU kernel (how fast a core runs
//! now) and writing fresh anonymous pages (how fast the host backs new
//! memory), each timed every [`CPU_SAMPLE_INTERVAL`] on a thread of its own.

use std::time::{Duration, Instant};

use super::counters::{median, Conditions};

/// Steps of one CPU kernel sample: a dependent multiply-add chain of about
/// 2 ms on this host.
const CPU_KERNEL_STEPS: u32 = 500_000;
/// Time between two samples: 2 ms in 250 take under 1% of one core from the run.
const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
/// Bytes of fresh anonymous memory one sample maps, writes page by page and
/// unmaps: 256 pages, well under a millisecond on a host that backs memory
/// at once, a few ms on one that does not.
const FRESH_SAMPLE_BYTES: usize = 1 << 20;
const PAGE_BYTES: usize = 4096;

/// Milliseconds of one fixed single-threaded dependent multiply-add chain:
/// how fast a core runs now.
fn time_cpu_kernel() -> f64 {
    let t0 = Instant::now();
    let mut x = std::hint::black_box(1.0f64);
    for i in 0..CPU_KERNEL_STEPS {
        x = x.mul_add(0.999_999_9, f64::from(i & 7) * 1e-9);
    }
    std::hint::black_box(x);
    t0.elapsed().as_secs_f64() * 1e3
}

/// Microseconds per page to write [`FRESH_SAMPLE_BYTES`] of a new anonymous
/// mapping, one byte a page (None if the mapping fails).
fn time_fresh_pages() -> Option<f64> {
    let mut m = memmap2::MmapMut::map_anon(FRESH_SAMPLE_BYTES).ok()?;
    let t0 = Instant::now();
    for i in (0..FRESH_SAMPLE_BYTES).step_by(PAGE_BYTES) {
        m[i] = 1;
    }
    std::hint::black_box(&m);
    let us = t0.elapsed().as_secs_f64() * 1e6;
    Some(us / (FRESH_SAMPLE_BYTES / PAGE_BYTES) as f64)
}

/// The medians of the speed kernels sampled while a run ran.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Speeds {
    pub(crate) cpu_kernel_ms: Option<f64>,
    pub(crate) fresh_page_us: Option<f64>,
}

impl Speeds {
    /// `c` with these medians in its speed fields.
    pub(crate) fn onto(self, c: Conditions) -> Conditions {
        Conditions {
            cpu_kernel_ms: self.cpu_kernel_ms,
            fresh_page_us: self.fresh_page_us,
            ..c
        }
    }
}

/// Run `work` while a thread beside it times the CPU kernel and the fresh
/// pages every [`CPU_SAMPLE_INTERVAL`]; returns its result and the samples'
/// medians (None when it ended before the first sample). The host's speed
/// moves within seconds on a shared host, so it is sampled across the run,
/// not before it.
pub(crate) fn with_speed_samples<T>(work: impl FnOnce() -> T) -> (T, Speeds) {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let sampler = s.spawn(move || {
            let (mut ms, mut us) = (Vec::new(), Vec::new());
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(CPU_SAMPLE_INTERVAL)
            {
                ms.push(time_cpu_kernel());
                us.extend(time_fresh_pages());
            }
            (ms, us)
        });
        let out = work();
        drop(stop);
        let (ms, us) = sampler.join().unwrap_or_default();
        let speeds = Speeds {
            cpu_kernel_ms: median(ms),
            fresh_page_us: median(us),
        };
        (out, speeds)
    })
}
