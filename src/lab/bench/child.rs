//! Children of `bmoe bench` (each measured `bmoe run`) die with it: a bench
//! killed with SIGKILL, which cannot clean up, must not leave a run reading
//! the disk beside whatever is measured next. Each starts with the bench's
//! `oom_score_adj` from before any balloon, so the bench holding a balloon
//! stays first in the OOM killer's line, before any run being measured.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{error::io_err, error::BenchError, plan::BenchPlan};

/// This process's `oom_score_adj` as it was before anything of the bench
/// changed it: read once, by the first caller (the balloon calls this before
/// it raises the value). None when it cannot be read.
pub(crate) fn base_oom_score_adj() -> Option<&'static str> {
    static BASE: OnceLock<Option<String>> = OnceLock::new();
    BASE.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/self/oom_score_adj").ok()?;
        Some(text.trim().to_string())
    })
    .as_deref()
}

/// Arm `PR_SET_PDEATHSIG` (SIGKILL) in the child of `cmd` before it execs,
/// give it the bench's [`base_oom_score_adj`], and refuse to start it when the
/// parent is already gone. The death signal comes when the thread that spawned
/// the child ends: spawn from the bench's own thread.
pub(crate) fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id();
    // Allocated here, before the fork: the hook below must not allocate.
    let adj: Option<Vec<u8>> = base_oom_score_adj().map(|s| s.as_bytes().to_vec());
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
        if let Some(v) = &adj {
            set_oom_score_adj(v);
        }
        Ok(())
    };
    // The hook runs in the forked child before exec and only calls
    // async-signal-safe functions (see `arm` and `set_oom_score_adj`).
    // SAFETY: as the comment above says.
    unsafe { cmd.pre_exec(arm) }
}

/// Write `value` to `/proc/self/oom_score_adj`, best effort (a child that
/// keeps the bench's value is still measured; it is only earlier in the OOM
/// killer's line). Between fork and exec: open, write and close only.
fn set_oom_score_adj(value: &[u8]) {
    let path = c"/proc/self/oom_score_adj";
    // open(2), write(2) and close(2) are async-signal-safe; the path is a
    // static C string and `value` a live buffer of `value.len()` bytes.
    // SAFETY: as the comment above says.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let _ = libc::write(fd, value.as_ptr().cast(), value.len());
            libc::close(fd);
        }
    }
}

/// The last non-empty line of a file (a failed run's error message).
fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Start one `bmoe run` and wait for it (at most `timeout`).
pub(super) fn run_child(
    plan: &BenchPlan,
    args: &[String],
    prompt_path: &Path,
    tokens: u32,
    stem: &Path,
) -> Result<(Option<String>, f64), BenchError> {
    let csv = stem.with_extension("csv");
    let out = stem.with_extension("out");
    let err = stem.with_extension("err");
    let t0 = Instant::now();
    let mut child = dies_with_parent(&mut Command::new(&plan.exe))
        .arg("run")
        .arg("-m")
        .arg(&plan.model)
        .arg("-f")
        .arg(prompt_path)
        .arg("-n")
        .arg(tokens.to_string())
        // Rates are measured over exactly -n tokens, whatever the model says.
        .arg("--ignore-eos")
        .arg("--csv")
        .arg(&csv)
        .args(args)
        .args(
            plan.route_from
                .iter()
                .flat_map(|t| [OsStr::new("--route-from"), t.as_os_str()]),
        )
        .stdin(Stdio::null())
        .stdout(File::create(&out).map_err(io_err("create", &out))?)
        .stderr(File::create(&err).map_err(io_err("create", &err))?)
        .spawn()
        .map_err(io_err("start", &plan.exe))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > plan.run_timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(io_err("wait for", &plan.exe)(e)),
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let failure = match status {
        None => Some(format!(
            "killed after the {} s run timeout",
            plan.run_timeout.as_secs()
        )),
        Some(s) if !s.success() => Some(format!("{s}: {}", last_line(&err))),
        Some(_) => None,
    };
    Ok((failure, wall))
}
