//! Children of `bmoe bench` (each measured `bmoe run`, the busy neighbour) die
//! with it: a bench killed with SIGKILL, which cannot clean up, must not leave
//! a run reading the disk beside whatever is measured next.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Arm `PR_SET_PDEATHSIG` (SIGKILL) in the child of `cmd` before it execs, and
/// refuse to start it when the parent is already gone. The death signal comes
/// when the thread that spawned the child ends: spawn from the bench's own
/// thread.
pub fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id();
    let arm = move || {
        // prctl(PR_SET_PDEATHSIG) takes no pointers and is
        // async-signal-safe, as code between fork and exec must be; the
        // closure allocates nothing before it returns Ok.
        // SAFETY: as the comment above says.
        let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // parent_id is getppid(2): async-signal-safe too.
        if std::os::unix::process::parent_id() != parent {
            // The parent died before the signal was armed.
            return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        }
        Ok(())
    };
    // The hook runs in the forked child before exec and only calls
    // async-signal-safe functions (see `arm`).
    // SAFETY: as the comment above says.
    unsafe { cmd.pre_exec(arm) }
}
