//! Fault injection for the flash reader (tests and `bmoe run --inject-faults`):
//! a [`RawSource`] over the model file that, at seeded random reads, fails with
//! EIO, returns a short read, fails with EAGAIN, or is slow.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::io::RawSource;

/// Per-read probabilities of each fault (checked in this order), and a seed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub seed: u64,
    /// Fail with EIO (a persistent error: the run must stop).
    pub eio: f64,
    /// Return at most half of what was asked (the reader must ask for the rest).
    pub short: f64,
    /// Fail with EAGAIN (transient: retried, within a bound).
    pub eagain: f64,
    /// Sleep `slow_ms` before reading.
    pub slow: f64,
    pub slow_ms: u64,
    /// Panic in the flash thread (stands for a bug in the actor: the run must
    /// stop with an error, not hang).
    pub panic: f64,
}

impl std::str::FromStr for FaultPlan {
    type Err = String;
    /// `seed=1,eio=0.001,short=0.05,eagain=0.05,slow=0.01,slow_ms=5`
    fn from_str(s: &str) -> Result<Self, String> {
        let mut p = FaultPlan {
            slow_ms: 5,
            ..Default::default()
        };
        for part in s.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let prob = |v: &str| -> Result<f64, String> {
                let x: f64 = v.parse().map_err(|_| format!("{k}={v}: not a number"))?;
                if (0.0..=1.0).contains(&x) {
                    Ok(x)
                } else {
                    Err(format!("{k}={v}: a probability is in 0..=1"))
                }
            };
            let int = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{k}={v}: not an integer"))
            };
            match k {
                "seed" => p.seed = int(v)?,
                "eio" => p.eio = prob(v)?,
                "short" => p.short = prob(v)?,
                "eagain" => p.eagain = prob(v)?,
                "slow" => p.slow = prob(v)?,
                "slow_ms" => p.slow_ms = int(v)?,
                "panic" => p.panic = prob(v)?,
                _ => {
                    return Err(format!(
                        "unknown fault {k:?} (seed, eio, short, eagain, slow, slow_ms, panic)"
                    ))
                }
            }
        }
        Ok(p)
    }
}

/// How many faults were injected.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub reads: AtomicU64,
    pub eio: AtomicU64,
    pub short: AtomicU64,
    pub eagain: AtomicU64,
    pub slow: AtomicU64,
}

impl FaultCounts {
    pub fn summary(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "injected faults over {} reads: {} EIO, {} short, {} EAGAIN, {} slow",
            l(&self.reads),
            l(&self.eio),
            l(&self.short),
            l(&self.eagain),
            l(&self.slow)
        )
    }
}

/// The model file behind seeded faults.
pub struct FaultySource {
    file: File,
    plan: FaultPlan,
    state: u64,
    counts: Arc<FaultCounts>,
}

impl FaultySource {
    pub fn open(path: &Path, plan: FaultPlan) -> std::io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
            state: plan.seed ^ 0x5eed_fa17,
            plan,
            counts: Arc::new(FaultCounts::default()),
        })
    }

    pub fn counts(&self) -> Arc<FaultCounts> {
        self.counts.clone()
    }

    /// Uniform in [0, 1) (SplitMix64).
    fn draw(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
    }
}

impl RawSource for FaultySource {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let c = self.counts.clone();
        c.reads.fetch_add(1, Ordering::Relaxed);
        if self.draw() < self.plan.panic {
            panic!("injected panic in the flash reader (--inject-faults panic=...)");
        }
        if self.draw() < self.plan.eio {
            c.eio.fetch_add(1, Ordering::Relaxed);
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let short = self.draw() < self.plan.short;
        if self.draw() < self.plan.eagain {
            c.eagain.fetch_add(1, Ordering::Relaxed);
            return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        }
        if self.draw() < self.plan.slow {
            c.slow.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(self.plan.slow_ms));
        }
        if short && buf.len() > 1 {
            c.short.fetch_add(1, Ordering::Relaxed);
            let half = buf.len() / 2;
            return self.file.read_at(&mut buf[..half], offset);
        }
        self.file.read_at(buf, offset)
    }
}
