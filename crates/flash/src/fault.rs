//! Fault injection for the flash reader (tests and `bmoe run --inject-faults`),
//! under either reader: a [`RawSource`] over the model file for the pread
//! reader, and a [`Ring`] for the io_uring reader ([`FaultyRing`]). At seeded
//! random reads they fail with EIO, return a short read, fail with EAGAIN or
//! EINTR, or are slow; the ring also completes reads out of order, holds some
//! back past later waits, and fails waits with EINTR.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::error::FlashError;
use super::io::{PreadReader, RawSource, SliceReader};
use super::open::ReaderNote;
use super::ring::Ring;
use super::uring::UringReader;

/// Per-read probabilities of each fault (checked in this order), and a seed.
/// The reader that fault injection runs under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FaultReader {
    /// The io_uring reader over a [`FaultyRing`] (what a real run uses).
    #[default]
    Uring,
    /// The pread reader over a [`FaultySource`].
    Pread,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub seed: u64,
    /// Fail with EIO (a persistent error: the run must stop).
    pub eio: f64,
    /// Return at most half of what was asked (the reader must ask for the rest).
    pub short: f64,
    /// Fail with EAGAIN (transient: retried, within a bound).
    pub eagain: f64,
    /// Fail with EINTR (transient, like EAGAIN); under the ring a wait fails
    /// with EINTR at this rate too.
    pub eintr: f64,
    /// Sleep `slow_ms` before reading.
    pub slow: f64,
    pub slow_ms: u64,
    /// Ring only: hold a completion back past the current wait.
    pub delay: f64,
    /// Which reader the faults go under.
    pub reader: FaultReader,
    /// Panic in the verify context's eval observer at its Nth observed node
    /// (0: never; stands for a bug in the hook: the decode must abort).
    pub observer_panic_at: u64,
    /// Panic in the flash thread (stands for a bug in the actor: the run must
    /// stop with an error, not hang).
    pub panic: f64,
}

impl std::str::FromStr for FaultPlan {
    type Err = String;
    /// `seed=1,eio=0.001,short=0.05,eagain=0.05,eintr=0.05,slow=0.01,slow_ms=5,delay=0.3,reader=uring`
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
                "eintr" => p.eintr = prob(v)?,
                "observer_panic_at" => p.observer_panic_at = int(v)?,
                "delay" => p.delay = prob(v)?,
                "reader" => {
                    p.reader = match v {
                        "uring" => FaultReader::Uring,
                        "pread" => FaultReader::Pread,
                        _ => return Err(format!("reader={v}: uring or pread")),
                    }
                }
                "slow" => p.slow = prob(v)?,
                "slow_ms" => p.slow_ms = int(v)?,
                "panic" => p.panic = prob(v)?,
                _ => {
                    return Err(format!(
                    "unknown fault {k:?} (seed, eio, short, eagain, eintr, slow, slow_ms, delay, \
                         panic, reader, observer_panic_at)"
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
    pub eintr: AtomicU64,
    pub slow: AtomicU64,
    /// Ring only: completions held back past a wait, and waits failed with EINTR.
    pub delayed: AtomicU64,
    pub wait_eintr: AtomicU64,
}

impl FaultCounts {
    pub fn summary(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "injected faults over {} reads: {} EIO, {} short, {} EAGAIN, {} EINTR, {} slow, \
             {} delayed, {} interrupted waits",
            l(&self.reads),
            l(&self.eio),
            l(&self.short),
            l(&self.eagain),
            l(&self.eintr),
            l(&self.slow),
            l(&self.delayed),
            l(&self.wait_eintr)
        )
    }
}

/// A seeded SplitMix64 stream of uniform draws.
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Self {
        Self(seed ^ 0x5eed_fa17)
    }

    /// Uniform in [0, 1).
    fn draw(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        ((self.draw() * n as f64) as usize).min(n - 1)
    }
}

/// What happens to one read.
enum Outcome {
    Fail(i32),
    /// Read at most half of what was asked.
    Short,
    Full,
}

/// Draw one read's fate (counted), sleeping first when it is slow.
fn decide(plan: &FaultPlan, dice: &mut Dice, c: &FaultCounts) -> Outcome {
    c.reads.fetch_add(1, Ordering::Relaxed);
    if dice.draw() < plan.panic {
        panic!("injected panic in the flash reader (--inject-faults panic=...)");
    }
    if dice.draw() < plan.eio {
        c.eio.fetch_add(1, Ordering::Relaxed);
        return Outcome::Fail(libc::EIO);
    }
    let short = dice.draw() < plan.short;
    if dice.draw() < plan.eagain {
        c.eagain.fetch_add(1, Ordering::Relaxed);
        return Outcome::Fail(libc::EAGAIN);
    }
    if dice.draw() < plan.eintr {
        c.eintr.fetch_add(1, Ordering::Relaxed);
        return Outcome::Fail(libc::EINTR);
    }
    if dice.draw() < plan.slow {
        c.slow.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(plan.slow_ms));
    }
    if short {
        c.short.fetch_add(1, Ordering::Relaxed);
        return Outcome::Short;
    }
    Outcome::Full
}

/// The model file behind seeded faults (for the pread reader).
pub struct FaultySource {
    file: File,
    plan: FaultPlan,
    dice: Dice,
    counts: Arc<FaultCounts>,
}

impl FaultySource {
    pub fn open(path: &Path, plan: FaultPlan) -> std::io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
            dice: Dice::new(plan.seed),
            plan,
            counts: Arc::new(FaultCounts::default()),
        })
    }

    pub fn counts(&self) -> Arc<FaultCounts> {
        self.counts.clone()
    }
}

impl RawSource for FaultySource {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        match decide(&self.plan, &mut self.dice, &self.counts) {
            Outcome::Fail(errno) => Err(std::io::Error::from_raw_os_error(errno)),
            Outcome::Short if buf.len() > 1 => {
                let half = buf.len() / 2;
                self.file.read_at(&mut buf[..half], offset)
            }
            _ => self.file.read_at(buf, offset),
        }
    }
}

/// One queued read of the test ring.
struct Entry {
    dst: *mut u8,
    len: u32,
    offset: u64,
    tag: u64,
}

/// A ring over the model file, driven by seeded faults: completions in random
/// order, some held back past later waits (the read's bytes land only when it
/// completes, as the kernel's would), failed reads (EIO also scribbles over the
/// destination, as a partial transfer can), short reads, transient errors, and
/// waits interrupted by EINTR. `pending()` tells a test what is still in flight.
pub struct FaultyRing {
    file: File,
    plan: FaultPlan,
    dice: Dice,
    counts: Arc<FaultCounts>,
    capacity: usize,
    queued: Vec<Entry>,
    in_flight: Vec<Entry>,
    ready: VecDeque<(u64, i32)>,
    pending: Arc<AtomicU64>,
}

// SAFETY: the raw destinations are the reader's (valid until their completion
// is reaped, per `Ring::push_read`); the ring is used by one thread at a time.
unsafe impl Send for FaultyRing {}

impl FaultyRing {
    /// A ring over `path` with room for `capacity` queued reads.
    pub fn open(path: &Path, plan: FaultPlan, capacity: usize) -> std::io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
            dice: Dice::new(plan.seed),
            plan,
            counts: Arc::new(FaultCounts::default()),
            capacity,
            queued: Vec::new(),
            in_flight: Vec::new(),
            ready: VecDeque::new(),
            pending: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn counts(&self) -> Arc<FaultCounts> {
        self.counts.clone()
    }

    /// Reads submitted or queued whose completion has not been reaped yet.
    pub fn pending(&self) -> Arc<AtomicU64> {
        self.pending.clone()
    }

    /// Perform one read now and make its completion ready.
    fn complete(&mut self, e: Entry) {
        // SAFETY: `dst` is valid for `len` bytes until this completion is reaped
        // (push_read's contract), and nobody else touches it meanwhile.
        let buf = unsafe { std::slice::from_raw_parts_mut(e.dst, e.len as usize) };
        let res = match decide(&self.plan, &mut self.dice, &self.counts) {
            Outcome::Fail(errno) => {
                if errno == libc::EIO {
                    let n = buf.len() / 2;
                    buf[..n].fill(0xEE);
                }
                -errno
            }
            Outcome::Short if buf.len() > 1 => {
                let half = buf.len() / 2;
                read_result(self.file.read_at(&mut buf[..half], e.offset))
            }
            _ => read_result(self.file.read_at(buf, e.offset)),
        };
        self.ready.push_back((e.tag, res));
    }
}

fn read_result(r: std::io::Result<usize>) -> i32 {
    match r {
        Ok(n) => n as i32,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}

impl Ring for FaultyRing {
    unsafe fn push_read(&mut self, dst: *mut u8, len: u32, offset: u64, tag: u64) -> bool {
        if self.queued.len() + self.in_flight.len() + self.ready.len() >= self.capacity {
            return false;
        }
        self.queued.push(Entry {
            dst,
            len,
            offset,
            tag,
        });
        self.pending.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn submit_and_wait(&mut self, want: usize) -> std::io::Result<()> {
        self.in_flight.append(&mut self.queued);
        if self.dice.draw() < self.plan.eintr {
            self.counts.wait_eintr.fetch_add(1, Ordering::Relaxed);
            return Err(std::io::Error::from_raw_os_error(libc::EINTR));
        }
        // Complete a random subset, in random order; hold the rest back, but
        // always make `want` completions ready while reads are in flight.
        let mut i = 0;
        while i < self.in_flight.len() {
            let enough = self.ready.len() >= want;
            if enough && self.dice.draw() < self.plan.delay {
                self.counts.delayed.fetch_add(1, Ordering::Relaxed);
                i += 1;
                continue;
            }
            let pick = i + self.dice.below(self.in_flight.len() - i);
            let e = self.in_flight.swap_remove(pick);
            self.complete(e);
        }
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        let n = self.ready.len() as u64;
        out.extend(self.ready.drain(..));
        self.pending.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A reader under injected faults, what it injects, and a note saying so.
pub struct FaultyReader {
    pub reader: Box<dyn SliceReader>,
    pub counts: Arc<FaultCounts>,
    pub note: ReaderNote,
}

/// A reader over `path` under `plan`'s faults, on the reader the plan names
/// (io_uring over a [`FaultyRing`] by default, else pread over a
/// [`FaultySource`]), with what it injects counted and a note saying so.
pub fn open_faulty_reader(
    path: &Path,
    plan: &FaultPlan,
    queue_depth: u32,
    max_slice_bytes: u64,
) -> Result<FaultyReader, FlashError> {
    let open_err = |source| FlashError::Open {
        path: path.to_path_buf(),
        source,
    };
    let note = ReaderNote::FaultInjection {
        plan: format!("{plan:?}"),
    };
    match plan.reader {
        FaultReader::Pread => {
            let src = FaultySource::open(path, plan.clone()).map_err(open_err)?;
            let counts = src.counts();
            let reader = Box::new(PreadReader::new(Box::new(src), path, max_slice_bytes)?);
            Ok(FaultyReader {
                reader,
                counts,
                note,
            })
        }
        FaultReader::Uring => {
            let depth = queue_depth.clamp(1, 256);
            let ring =
                FaultyRing::open(path, plan.clone(), 2 * depth as usize).map_err(open_err)?;
            let counts = ring.counts();
            let reader = UringReader::with_ring(
                Box::new(ring),
                path.to_path_buf(),
                false,
                depth,
                max_slice_bytes,
            )
            .map_err(|(_, e)| open_err(e))?;
            Ok(FaultyReader {
                reader: Box::new(reader),
                counts,
                note,
            })
        }
    }
}
