//! A busy neighbour for the bench's self-test of its conditions flags: a
//! thread of the bench (`bmoe-neighbour`) that keeps one core busy until it is
//! stopped. `bmoe bench --busy-neighbour RUNS` starts one beside the listed
//! runs; those runs must come out flagged.
//!
//! Its CPU time is the bench's own in `/proc/self/stat`, so the host samples
//! around a run take the thread's ticks out ([`Neighbour::not_own`]): to the
//! conditions it is another process's load, as a neighbour on the host is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::error::BenchError;
use super::host::{self, HostSample};

/// The thread's name, as `/proc/self/task/TID/comm` shows it.
const NAME: &str = "bmoe-neighbour";

/// Capacity of the channel the busy thread sends its thread id on, once.
const TID_CAPACITY: usize = 1;

/// A running neighbour; dropping it stops the thread and joins it.
#[derive(Debug)]
pub(crate) struct Neighbour {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The thread's kernel id, for its `/proc/self/task/TID/stat`.
    tid: i32,
}

impl Neighbour {
    /// Start the busy thread; returns once it runs.
    pub(crate) fn start() -> Result<Self, BenchError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(TID_CAPACITY);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(NAME.into())
            .spawn(move || {
                // SAFETY: gettid(2) takes no arguments and cannot fail.
                let tid = unsafe { libc::gettid() };
                let _ = tid_tx.send(tid);
                spin_until(&flag);
            })
            .map_err(|e| BenchError::Config(format!("start the busy neighbour: {e}")))?;
        let tid = tid_rx
            .recv()
            .map_err(|_| BenchError::Config("the busy neighbour ended at once".into()))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            tid,
        })
    }

    /// `sample` with this thread's CPU time and faults taken out of the
    /// bench's own, so they count as another's.
    pub(crate) fn not_own(&self, sample: HostSample) -> HostSample {
        let path = format!("/proc/self/task/{}/stat", self.tid);
        let text = std::fs::read_to_string(path).unwrap_or_default();
        match host::parse_thread_stat(&text) {
            Some(t) => sample.without(t),
            None => sample,
        }
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Busy work until `stop` is set.
fn spin_until(stop: &AtomicBool) {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..100_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread's counters now.
    fn thread_ticks(n: &Neighbour) -> u64 {
        let t = std::fs::read_to_string(format!("/proc/self/task/{}/stat", n.tid)).unwrap();
        host::parse_thread_stat(&t).unwrap().ticks
    }

    #[test]
    fn the_neighbour_keeps_a_core_busy_and_is_not_the_bench_s_own() {
        let n = Neighbour::start().unwrap();
        let comm = std::fs::read_to_string(format!("/proc/self/task/{}/comm", n.tid)).unwrap();
        assert_eq!(comm.trim(), NAME);
        // It runs: 50 ms of CPU (5 ticks) within 5 s, even on a busy shared host.
        let t0 = std::time::Instant::now();
        while thread_ticks(&n) < 5 {
            assert!(t0.elapsed().as_secs() < 5, "the neighbour does not run");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let ran = thread_ticks(&n);
        // A sample taken beside it leaves at least that much out of the bench's own.
        let s = host::sample(None);
        let taken = s.own.ticks - n.not_own(s.clone()).own.ticks;
        assert!(
            taken >= ran,
            "took {taken} ticks out, the thread had run {ran}"
        );
        let task = format!("/proc/self/task/{}", n.tid);
        drop(n);
        let t0 = std::time::Instant::now();
        while std::path::Path::new(&task).exists() {
            assert!(t0.elapsed().as_secs() < 2, "the thread outlived its drop");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
