//! `bmoe serve --rpc`: a supervisor that survives a lost RPC host.
//!
//! ggml's RPC client has no error path (a broken connection is `GGML_ABORT`,
//! turned into exit 5 by [`crate::llama::rpc::arm_lost_host_exit`]), so no
//! process that uses it can outlive a lost host. The supervisor holds the
//! listening port and no model: it runs `bmoe serve` again as an engine
//! process on a loopback port ([`engine_process`]), forwards each request
//! to it ([`proxy`]), and when it ends with exit 5 answers the request in
//! flight with 502, then starts it again (which reconnects and sends the
//! remote layers once more) until it serves, answering 503 with the reason
//! meanwhile. Any other ending of the engine ends the server with its code.

mod engine_process;
mod proxy;
mod state;

pub use engine_process::{announce_ready, is_engine_child};

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use state::{Phase, Supervised};

/// The first start's one outcome, sent once.
const FIRST_START_CAPACITY: usize = 1;

/// Longest wait between two starts of an engine process that fail.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(5);

/// The supervisor's settings.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The engine process: this binary and `bmoe serve`'s own arguments.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The first wait before starting a lost engine again (doubled per
    /// failed start, up to [`MAX_RESTART_DELAY`]).
    pub restart_delay: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot start the engine process {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the engine process stopped before it served ({how}; its reason is above)")]
    FirstStart { code: Option<i32>, how: String },
    #[error("the engine process stopped ({how}; its reason is above); bmoe serve stops with it")]
    Ended { code: Option<i32>, how: String },
    /// The port or the HTTP side (serve's own errors: `Bind`, `Io`).
    #[error(transparent)]
    Serve(#[from] super::ServeError),
}

impl From<std::io::Error> for SupervisorError {
    fn from(e: std::io::Error) -> Self {
        Self::Serve(super::ServeError::Io(e))
    }
}

impl SupervisorError {
    /// The engine process's own exit code, where it gave one: the binary
    /// exits with it (a model file missing is 3 whichever process found it).
    pub fn engine_code(&self) -> Option<u8> {
        match self {
            Self::FirstStart { code, .. } | Self::Ended { code, .. } => {
                code.and_then(|c| u8::try_from(c).ok())
            }
            _ => None,
        }
    }
}

/// Start the engine process, listen once it serves (`on_ready` is told the
/// address and its pid), and keep it serving until SIGINT/SIGTERM.
pub fn supervise(
    cfg: SupervisorConfig,
    on_ready: impl FnOnce(SocketAddr, u32),
) -> Result<(), SupervisorError> {
    let listener =
        std::net::TcpListener::bind(cfg.addr).map_err(|source| super::ServeError::Bind {
            addr: cfg.addr,
            source,
        })?;
    listener.set_nonblocking(true)?;
    let sup = Arc::new(Supervised::new());
    let (first_tx, first_rx) = std::sync::mpsc::sync_channel(FIRST_START_CAPACITY);
    let looper = {
        let sup = sup.clone();
        std::thread::Builder::new()
            .name("bmoe-supervisor".into())
            .spawn(move || keep_serving(&cfg, &sup, first_tx))?
    };
    let pid = match first_start(&sup, &first_rx) {
        Some(Ok(pid)) => pid,
        Some(Err(e)) => {
            let _ = looper.join();
            return Err(e);
        }
        None => return finish(&sup, looper),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = rt.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        on_ready(listener.local_addr()?, pid);
        let stop = super::shutdown_on_signal().map_err(|_| std::io::Error::other("signals"))?;
        let router = axum::Router::new()
            .fallback(proxy::handle)
            .with_state(sup.clone());
        let ended = sup.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                tokio::select! {
                    _ = super::stopping(stop) => {}
                    _ = ended.finished.notified() => {}
                }
            })
            .await
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    let engine = finish(&sup, looper);
    served?;
    engine
}

/// Wait for the first start: its pid once it serves, its failure, or None
/// when a signal came first.
fn first_start(
    sup: &Supervised,
    first: &std::sync::mpsc::Receiver<Result<u32, SupervisorError>>,
) -> Option<Result<u32, SupervisorError>> {
    loop {
        if crate::interrupt::requested().is_some() {
            sup.stop();
            return None;
        }
        match first.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => return Some(r),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => return None,
        }
    }
}

/// Stop the engine process (SIGTERM, SIGKILL after the shutdown deadline)
/// and the loop; the loop's verdict.
fn finish(
    sup: &Supervised,
    looper: std::thread::JoinHandle<Result<(), SupervisorError>>,
) -> Result<(), SupervisorError> {
    sup.stop();
    let t0 = Instant::now();
    while !looper.is_finished() {
        if t0.elapsed() > super::SHUTDOWN_DEADLINE + Duration::from_secs(2) {
            sup.signal(libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    looper.join().unwrap_or(Ok(()))
}

/// The loop: start the engine process, and again each time it lost a host,
/// until the supervisor stops; the first start's outcome goes to `first`.
fn keep_serving(
    cfg: &SupervisorConfig,
    sup: &Supervised,
    first: std::sync::mpsc::SyncSender<Result<u32, SupervisorError>>,
) -> Result<(), SupervisorError> {
    let mut first = Some(first);
    let mut attempts = 0u32;
    while !sup.stopping() {
        let spawned = engine_process::spawn(&cfg.program, &cfg.args).map_err(|source| {
            SupervisorError::Spawn {
                program: cfg.program.clone(),
                source,
            }
        });
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => return report_first(&mut first, e),
        };
        sup.set_pid(spawned.pid());
        let ended = match spawned.ready()? {
            Ok(serving) => {
                sup.set_phase(Phase::Ready(serving.addr));
                if let Some(f) = first.take() {
                    let _ = f.send(Ok(serving.pid()));
                }
                attempts = 0;
                serving.wait()?
            }
            Err(ended) => {
                attempts += 1;
                ended
            }
        };
        sup.set_pid(0);
        if sup.stopping() {
            break;
        }
        let how = engine_process::describe(ended.status);
        if let Some(f) = first.take() {
            let code = ended.status.code();
            let _ = f.send(Err(SupervisorError::FirstStart { code, how }));
            return Ok(());
        }
        if !engine_process::lost_a_host(ended.status) {
            sup.finished.notify_one();
            let code = ended.status.code();
            return match code {
                Some(0) => Ok(()),
                _ => Err(SupervisorError::Ended { code, how }),
            };
        }
        let reason = ended
            .reason
            .unwrap_or_else(|| format!("an RPC host was lost ({how})"));
        sup.set_phase(Phase::Reconnecting { reason, attempts });
        pause(sup, restart_delay(cfg.restart_delay, attempts));
    }
    Ok(())
}

/// `e` to whoever waits for the first start, else as the loop's end.
fn report_first(
    first: &mut Option<std::sync::mpsc::SyncSender<Result<u32, SupervisorError>>>,
    e: SupervisorError,
) -> Result<(), SupervisorError> {
    match first.take() {
        Some(f) => {
            let _ = f.send(Err(e));
            Ok(())
        }
        None => Err(e),
    }
}

/// The wait before the next start after `failed` failed starts in a row.
fn restart_delay(first: Duration, failed: u32) -> Duration {
    let doubled = first.saturating_mul(1u32 << failed.saturating_sub(1).min(8));
    doubled.min(MAX_RESTART_DELAY)
}

/// Sleep `d`, waking early when the supervisor stops.
fn pause(sup: &Supervised, d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d && !sup.stopping() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_delay_doubles_per_failed_start_up_to_its_ceiling() {
        let s = Duration::from_secs(1);
        let got: Vec<u64> = (0..6).map(|n| restart_delay(s, n).as_secs()).collect();
        assert_eq!(got, [1, 1, 2, 4, 5, 5]);
    }
}
