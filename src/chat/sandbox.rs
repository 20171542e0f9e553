//! A chat template rendered within limits. The template comes with the model
//! file (or `--chat-template-file`) and is a program: a loop can run for
//! hours, a string doubled forty times fills any memory, and minijinja has no
//! hook into its own `~`, `+`, `indent` or `replace`. So the render runs in a
//! child process, `bmoe __render-chat-template` (the job as JSON on its stdin,
//! the reply as JSON on its stdout), where the operating system holds it to
//! [`MEMORY_LIMIT_BYTES`] of address space and CPU time, minijinja's fuel to
//! [`STEP_BUDGET`] steps, and this side to [`TIME_LIMIT`] of wall time. The
//! caller waits on it while asking `cancelled` (a signal, a departed client):
//! a render that is no longer wanted is killed at once.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::jinja::{self, Now};
use crate::llama::LlamaError;

/// The hidden first argument that makes `bmoe` the renderer.
pub const CHILD_ARG: &str = "__render-chat-template";
/// Address space the renderer may add to what it starts with.
pub const MEMORY_LIMIT_BYTES: u64 = 1 << 30;
/// Wall time a render may take (a real template takes milliseconds).
pub const TIME_LIMIT: Duration = Duration::from_secs(10);
/// Steps (minijinja instructions) a render may take: a long conversation with
/// tools takes under a tenth of it with every real template.
pub const STEP_BUDGET: u64 = 20_000_000;
/// The longest prompt text a template may render.
pub const OUTPUT_LIMIT_BYTES: u64 = 64 << 20;
/// The most the renderer's stderr is kept (a panic or allocation message).
const STDERR_KEPT_BYTES: u64 = 16 << 10;

/// Which limit a render ran past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limit {
    Steps,
    Memory,
    Time,
    Output,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Steps => write!(f, "step budget ({STEP_BUDGET} steps)"),
            Limit::Memory => write!(f, "memory limit ({} MiB)", MEMORY_LIMIT_BYTES >> 20),
            Limit::Time => write!(f, "time limit ({} s)", TIME_LIMIT.as_secs()),
            Limit::Output => write!(f, "output limit ({} MiB)", OUTPUT_LIMIT_BYTES >> 20),
        }
    }
}

/// What a render is given: the template source, its variables, the time
/// `strftime_now` reads.
#[derive(Serialize, Deserialize)]
pub(crate) struct Job {
    pub source: String,
    pub vars: serde_json::Map<String, serde_json::Value>,
    /// Microseconds since the epoch (None: the clock).
    pub now_us: Option<i64>,
}

impl Job {
    pub(crate) fn now(&self) -> Option<Now> {
        self.now_us
            .and_then(chrono::DateTime::from_timestamp_micros)
    }
}

/// How a render failed, as the renderer reports it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Failure {
    Syntax(String),
    Render(String),
    Limit(Limit, String),
}

/// Errors rendering a conversation.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the model's chat template cannot render this conversation: {0}")]
    Render(String),
    #[error("the model's chat template is not valid Jinja: {0}")]
    Syntax(String),
    #[error("llama.cpp's built-in chat template failed: {0}")]
    Builtin(LlamaError),
    #[error("tokenizing the rendered prompt: {0}")]
    Tokenize(LlamaError),
    /// The template ran past one of its limits ([`super::sandbox`]).
    #[error("the chat template ran past its {limit}: {detail} (the template is at fault: fix it, or give another with --chat-template-file)")]
    Limit { limit: Limit, detail: String },
    #[error("rendering the chat template stopped: {0}")]
    Cancelled(&'static str),
    #[error("the chat template renderer failed: {0}")]
    Renderer(String),
}

impl TemplateError {
    /// Bad input: the template (or the conversation it refuses) is at fault,
    /// and another template or conversation would render.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            TemplateError::Render(_) | TemplateError::Syntax(_) | TemplateError::Limit { .. }
        )
    }
}

impl From<Failure> for TemplateError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Syntax(m) => TemplateError::Syntax(m),
            Failure::Render(m) => TemplateError::Render(m),
            Failure::Limit(limit, detail) => TemplateError::Limit { limit, detail },
        }
    }
}

type Reply = Result<String, Failure>;

/// Whether this executable is the renderer too (its `main` called
/// [`child_main`] first, as `bmoe`'s does).
static RENDERER_IS_SELF: AtomicBool = AtomicBool::new(false);

/// Render `job` in the renderer process, killing it as soon as `cancelled`
/// says why it is no longer wanted or it runs past [`TIME_LIMIT`]. In a
/// program that is not its own renderer (the library used by another
/// binary), in this process within the step and output limits only.
pub(crate) fn render(
    job: &Job,
    cancelled: &dyn Fn() -> Option<&'static str>,
) -> Result<String, TemplateError> {
    if !RENDERER_IS_SELF.load(Ordering::Relaxed) {
        return render_in_process(job).map_err(TemplateError::from);
    }
    let failed = |what: &str, e: std::io::Error| TemplateError::Renderer(format!("{what}: {e}"));
    let input = serde_json::to_vec(job).map_err(|e| TemplateError::Renderer(e.to_string()))?;
    let exe = std::env::current_exe().map_err(|e| failed("locating bmoe's executable", e))?;
    // Its own process group: a Ctrl-C at the terminal reaches bmoe, which
    // decides (`cancelled`), not the renderer.
    let mut child = Command::new(exe)
        .arg(CHILD_ARG)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed("starting the renderer", e))?;
    let stdin = child.stdin.take();
    // A renderer that dies early closes its stdin: the write fails, the exit
    // status says why.
    let writer = std::thread::spawn(move || stdin.map(|mut s| s.write_all(&input)));
    let stdout = reader(child.stdout.take(), 8 * OUTPUT_LIMIT_BYTES);
    let stderr = reader(child.stderr.take(), STDERR_KEPT_BYTES);
    let status = wait(&mut child, cancelled);
    let _ = writer.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let status = status?;
    if !status.success() {
        return Err(died(status, &String::from_utf8_lossy(&stderr)));
    }
    let reply: Reply = serde_json::from_slice(&stdout).map_err(|e| {
        TemplateError::Renderer(format!("the renderer's reply is not readable: {e}"))
    })?;
    reply.map_err(TemplateError::from)
}

/// A thread reading up to `limit_bytes` of `pipe`.
fn reader(pipe: Option<impl Read + Send + 'static>, limit_bytes: u64) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = pipe {
            let _ = p.take(limit_bytes).read_to_end(&mut buf);
        }
        buf
    })
}

/// The renderer's exit, or why it was killed first.
fn wait(
    child: &mut Child,
    cancelled: &dyn Fn() -> Option<&'static str>,
) -> Result<ExitStatus, TemplateError> {
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => {
                kill(child);
                return Err(TemplateError::Renderer(format!(
                    "waiting on the renderer: {e}"
                )));
            }
        }
        if let Some(why) = cancelled() {
            kill(child);
            return Err(TemplateError::Cancelled(why));
        }
        if t0.elapsed() >= TIME_LIMIT {
            kill(child);
            return Err(TemplateError::Limit {
                limit: Limit::Time,
                detail: format!("it was still rendering after {} s", TIME_LIMIT.as_secs()),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Why the renderer ended without a reply: an allocation refused (the
/// memory limit), its CPU time spent, or something else, said as it is.
fn died(status: ExitStatus, stderr: &str) -> TemplateError {
    use std::os::unix::process::ExitStatusExt;
    let stderr = stderr.trim();
    if stderr.contains("memory allocation of") || stderr.contains("capacity overflow") {
        return TemplateError::Limit {
            limit: Limit::Memory,
            detail: stderr.lines().next().unwrap_or_default().to_string(),
        };
    }
    if status.signal() == Some(libc::SIGXCPU) {
        return TemplateError::Limit {
            limit: Limit::Time,
            detail: "its CPU time ran out".into(),
        };
    }
    TemplateError::Renderer(format!("the renderer ended ({status}): {stderr}"))
}

/// Called first in `main`: in the renderer process (`bmoe
/// __render-chat-template`), render the job on stdin, reply on stdout, and
/// return the exit code; in any other, note that this executable renders
/// templates in a child of its own, and return None.
pub fn child_main() -> Option<ExitCode> {
    if std::env::args_os().nth(1).as_deref() != Some(OsStr::new(CHILD_ARG)) {
        RENDERER_IS_SELF.store(true, Ordering::Relaxed);
        return None;
    }
    confine();
    let job: Job = match serde_json::from_reader(std::io::stdin().lock()) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: reading the render job: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let reply: Reply = render_in_process(&job);
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer(&mut out, &reply)
        .and_then(|()| out.flush().map_err(serde_json::Error::io))
    {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: writing the render reply: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// The renderer's own limits: it dies with bmoe, its address space may grow
/// by [`MEMORY_LIMIT_BYTES`], its CPU time is twice [`TIME_LIMIT`] (a
/// backstop: bmoe's wall clock, which starts later, decides first).
fn confine() {
    // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let base_bytes = address_space_bytes().unwrap_or(0);
    let space_bytes = base_bytes + MEMORY_LIMIT_BYTES;
    set_limit(libc::RLIMIT_AS, space_bytes, space_bytes);
    let cpu_s = 2 * TIME_LIMIT.as_secs();
    // SIGXCPU at the soft limit (said as the time limit), SIGKILL a second later.
    set_limit(libc::RLIMIT_CPU, cpu_s, cpu_s + 1);
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) {
    debug_assert!(soft <= hard);
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the rlimit struct, which lives across the call.
    unsafe { libc::setrlimit(resource, &lim) };
}

/// This process's address space now (the first field of /proc/self/statm, in pages).
fn address_space_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_bytes).ok()?)
}

/// The job rendered in this process (the renderer's side).
pub(crate) fn render_in_process(job: &Job) -> Result<String, Failure> {
    render_with_fuel(job, STEP_BUDGET)
}

/// The job rendered in this process in `fuel` steps at most.
pub(super) fn render_with_fuel(job: &Job, fuel: u64) -> Result<String, Failure> {
    let env = jinja::environment(&job.source, job.now(), fuel)
        .map_err(|e| Failure::Syntax(describe(&e)))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| Failure::Syntax(describe(&e)))?;
    let text = tmpl
        .render(minijinja::Value::from_serialize(&job.vars))
        .map_err(|e| match e.kind() {
            minijinja::ErrorKind::OutOfFuel => Failure::Limit(Limit::Steps, describe(&e)),
            _ => Failure::Render(describe(&e)),
        })?;
    if text.len() as u64 > OUTPUT_LIMIT_BYTES {
        return Err(Failure::Limit(
            Limit::Output,
            format!("it rendered {} bytes", text.len()),
        ));
    }
    Ok(text)
}

/// A minijinja error with its cause chain, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn job(source: &str) -> Job {
        Job {
            source: source.into(),
            vars: serde_json::Map::new(),
            now_us: None,
        }
    }

    #[test]
    fn a_render_past_its_steps_or_output_names_the_limit() {
        let loops =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = TemplateError::from(super::render_in_process(&job(loops)).unwrap_err());
        assert!(
            e.to_string()
                .starts_with("the chat template ran past its step budget (20000000 steps)"),
            "{e}"
        );
        let wide = "{{ 'a' * 70000000 }}";
        let e = super::render_in_process(&job(wide)).unwrap_err();
        assert!(matches!(e, Failure::Limit(Limit::Output, _)), "{e:?}");
        assert_eq!(
            super::render_in_process(&job("{{ 'ab' * 2 }}")).unwrap(),
            "abab"
        );
    }

    #[test]
    fn a_renderer_that_died_is_said_as_the_limit_it_hit() {
        let abort = ExitStatus::from_raw(libc::SIGABRT);
        let e = died(abort, "memory allocation of 1000000000 bytes failed\n");
        assert!(
            matches!(
                e,
                TemplateError::Limit {
                    limit: Limit::Memory,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("memory limit (1024 MiB): memory allocation of 1000000000 bytes failed"),
            "{e}"
        );
        let e = died(ExitStatus::from_raw(libc::SIGXCPU), "");
        assert!(
            matches!(
                e,
                TemplateError::Limit {
                    limit: Limit::Time,
                    ..
                }
            ),
            "{e}"
        );
        let e = died(ExitStatus::from_raw(libc::SIGSEGV), "");
        assert!(matches!(e, TemplateError::Renderer(_)), "{e}");
        assert!(!e.is_bad_input());
    }
}
