//! A memory balloon to emulate a smaller host: a child process (`bmoe
//! balloon`, hidden) that touches N MiB of anonymous memory and holds it.
//! These hosts have no swap, so touched anonymous pages cannot be reclaimed
//! and the page cache has to make do with what is left.
//!
//! Safety rails: the child sets its own `oom_score_adj` to 1000 (the first
//! process the OOM killer picks), dies with its parent (`PR_SET_PDEATHSIG`),
//! exits by itself after `max_seconds`, and [`Balloon`]'s `Drop` kills and
//! reaps it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;

const MIB: u64 = 1024 * 1024;
const PAGE: usize = 4096;

/// The line the child prints once every page is touched.
const READY: &str = "BALLOON_READY";

/// A running balloon; dropping it deflates it.
#[derive(Debug)]
pub struct Balloon {
    child: Child,
    pub mib: u64,
    pub inflate_s: f64,
}

impl Balloon {
    /// Start `exe balloon --mib N --max-seconds T` and wait until it has
    /// touched every page.
    pub fn inflate(exe: &Path, mib: u64, max_seconds: u64) -> Result<Self, BenchError> {
        let t0 = Instant::now();
        let mut child = Command::new(exe)
            .args([
                "balloon",
                "--mib",
                &mib.to_string(),
                "--max-seconds",
                &max_seconds.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Balloon(format!("cannot start {}: {e}", exe.display())))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Balloon("no stdout pipe".into()))?;
        let mut ready = false;
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) if l.trim() == READY => {
                    ready = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if !ready {
            let status = child.wait().ok();
            return Err(BenchError::Balloon(format!(
                "the balloon process ended before holding {mib} MiB ({}); \
                 was it OOM-killed? Ask for less with a larger --ram-limit-mb",
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "unknown status".into())
            )));
        }
        Ok(Self {
            child,
            mib,
            inflate_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// Whether the balloon still holds its memory (it may have been OOM-killed).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Balloon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The balloon size that leaves about `limit_mib` MiB available, given the
/// current MemAvailable; `None` when memory is already at or below the limit.
pub fn size_for_limit(available_bytes: u64, limit_mib: u64) -> Option<u64> {
    let avail_mib = available_bytes / MIB;
    (avail_mib > limit_mib).then(|| avail_mib - limit_mib)
}

/// The child's side: touch `mib` MiB and hold them for at most `max_seconds`
/// or until the parent goes away.
pub fn hold(mib: u64, max_seconds: u64) -> Result<(), BenchError> {
    // The first process the OOM killer picks, before any run being measured.
    std::fs::write("/proc/self/oom_score_adj", "1000")
        .map_err(|e| BenchError::Balloon(format!("cannot set oom_score_adj: {e}")))?;
    let parent = std::os::unix::process::parent_id();
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    if rc != 0 {
        return Err(BenchError::Balloon(format!(
            "prctl(PR_SET_PDEATHSIG): {}",
            std::io::Error::last_os_error()
        )));
    }
    if std::os::unix::process::parent_id() != parent {
        // The parent died before the death signal was armed.
        return Ok(());
    }
    let len = usize::try_from(mib * MIB)
        .map_err(|_| BenchError::Balloon(format!("{mib} MiB does not fit this address space")))?;
    let buf = bmoe_actors::flash::AnonBuffer::zeroed(len)
        .map_err(|e| BenchError::Balloon(format!("{mib} MiB: {e}")))?;
    let t0 = Instant::now();
    for off in (0..len).step_by(PAGE) {
        // SAFETY: off < len <= buf.len(): inside the mapping, which is writable
        // and owned by this process alone; a volatile write forces the page in.
        unsafe { std::ptr::write_volatile(buf.as_ptr().add(off), 1) };
        if off % (4096 * MIB as usize) == 0 && off > 0 {
            crate::say!("balloon: {} MiB touched", off as u64 / MIB);
        }
    }
    crate::say!(
        "balloon: holding {mib} MiB (touched in {:.1} s, oom_score_adj 1000, at most {max_seconds} s)",
        t0.elapsed().as_secs_f64()
    );
    crate::stdio::out(&format!("{READY}\n"))
        .map_err(|e| BenchError::Balloon(format!("telling the bench it is ready: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(max_seconds);
    while Instant::now() < deadline && std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(buf);
    Ok(())
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
