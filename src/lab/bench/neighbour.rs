//! A busy neighbour for the bench's self-test of its conditions flags: a child
//! process (`bmoe burn`, hidden) that keeps every core busy until it is killed
//! or its deadline passes. `bmoe bench --busy-neighbour RUNS` starts one
//! beside the listed runs; those runs must come out flagged.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;

/// A running neighbour; dropping it kills and reaps it.
#[derive(Debug)]
pub struct Neighbour {
    child: Child,
}

impl Neighbour {
    /// Start `exe burn --max-seconds T`.
    pub fn start(exe: &Path, max_seconds: u64) -> Result<Self, BenchError> {
        let child = super::child::dies_with_parent(&mut Command::new(exe))
            .args(["burn", "--max-seconds", &max_seconds.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::Config(format!("start the busy neighbour: {e}")))?;
        Ok(Self { child })
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side: spin every core for at most `max_seconds`, or until the
/// parent goes away.
pub fn burn(max_seconds: u64) {
    let parent = std::os::unix::process::parent_id();
    let deadline = Instant::now() + Duration::from_secs(max_seconds);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(|| spin_until(deadline, parent));
        }
    });
}

/// Busy work until `deadline` or until `parent` is no longer our parent.
fn spin_until(deadline: Instant, parent: u32) {
    let mut x = 0u64;
    while Instant::now() < deadline && std::os::unix::process::parent_id() == parent {
        for _ in 0..1_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
    }
}
