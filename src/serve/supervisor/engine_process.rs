//! One engine process of a supervised `bmoe serve --rpc`: the same binary
//! and arguments, told by [`CHILD_ENV`] to serve on a loopback port of its
//! own and to say that port on stdout ([`announce_ready`]); its stderr passed
//! through line by line, its last `error:` line kept as the reason it ended.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;

/// Set (to `1`) in an engine process's environment by its supervisor.
pub(crate) const CHILD_ENV: &str = "BMOE_SERVE_ENGINE_CHILD";

/// The line an engine process writes on stdout once it accepts requests,
/// followed by its address.
const READY: &str = "bmoe-engine-ready ";

/// Whether this process is a supervised engine process.
pub fn is_engine_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some_and(|v| v == "1")
}

/// Tell the supervisor this engine process accepts requests at `addr`.
pub fn announce_ready(addr: SocketAddr) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{READY}{addr}");
    let _ = out.flush();
}

/// An engine process started, not yet known to serve.
pub(super) struct Spawned {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: JoinHandle<Option<String>>,
}

/// An engine process serving at `addr`.
pub(super) struct Serving {
    child: Child,
    pub(super) addr: SocketAddr,
    /// Held open: the process may write to it until it ends.
    _stdout: BufReader<ChildStdout>,
    stderr: JoinHandle<Option<String>>,
}

/// How an engine process ended: its status and last `error:` line.
pub(super) struct Ended {
    pub(super) status: ExitStatus,
    pub(super) reason: Option<String>,
}

/// Start `program args...` as an engine process. It dies with the thread
/// that started it (`PR_SET_PDEATHSIG`), so a supervisor killed outright
/// leaves no engine behind holding the model.
pub(super) fn spawn(program: &Path, args: &[OsString]) -> std::io::Result<Spawned> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: prctl(2) is a plain system call
    // and the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = cmd.spawn()?;
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other(
            "the engine process's pipes are missing",
        ));
    };
    let stderr = std::thread::Builder::new()
        .name("bmoe-engine-stderr".into())
        .spawn(move || pass_through(err))?;
    Ok(Spawned {
        child,
        stdout: BufReader::new(out),
        stderr,
    })
}

impl Spawned {
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait until it serves (its ready line) or ends before it does.
    pub(super) fn ready(mut self) -> std::io::Result<Result<Serving, Ended>> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                return Ok(Err(end(self.child, self.stderr)?));
            }
            let addr = line.trim_end().strip_prefix(READY).map(str::parse);
            if let Some(Ok(addr)) = addr {
                return Ok(Ok(Serving {
                    child: self.child,
                    addr,
                    _stdout: self.stdout,
                    stderr: self.stderr,
                }));
            }
        }
    }
}

impl Serving {
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait for it to end.
    pub(super) fn wait(self) -> std::io::Result<Ended> {
        end(self.child, self.stderr)
    }
}

/// Reap `child` and take its last `error:` line once its stderr closed.
fn end(mut child: Child, stderr: JoinHandle<Option<String>>) -> std::io::Result<Ended> {
    let status = child.wait()?;
    let reason = stderr.join().ok().flatten();
    Ok(Ended { status, reason })
}

/// Copy the engine's stderr to ours line by line; its last `error:` line
/// without the prefix.
fn pass_through(err: impl std::io::Read) -> Option<String> {
    let mut last = None;
    for line in BufReader::new(err).lines().map_while(Result::ok) {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        if let Some(why) = line.trim().strip_prefix("error: ") {
            last = Some(why.to_string());
        }
    }
    last
}

/// Whether an engine process that ended so is to be started again: it lost
/// an RPC host (exit 5, [`crate::llama::rpc::EXIT_REMOTE_LOST`]).
pub(super) fn lost_a_host(status: ExitStatus) -> bool {
    status.code() == Some(crate::llama::rpc::EXIT_REMOTE_LOST)
}

/// How `status` reads in a message.
pub(super) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}
