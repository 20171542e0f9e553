//! What the supervisor knows of its engine process, shared between the loop
//! that restarts it and the HTTP side that forwards to it or answers for it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

/// The engine process's phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// Loading (the first start).
    Starting,
    /// Accepting requests at this loopback address.
    Ready(SocketAddr),
    /// It lost an RPC host; started again until it serves.
    Reconnecting {
        reason: String,
        /// Starts that failed since it was lost.
        attempts: u32,
    },
}

/// The state both sides read: the phase, the process to signal, the stop.
pub(super) struct Supervised {
    phase: Mutex<Phase>,
    /// The engine process's pid (0: none running).
    pid: AtomicU32,
    stop: AtomicBool,
    /// Times the engine process was started again after a lost host.
    restarts: AtomicU32,
    /// Told when the engine ended for good (the server stops with it).
    pub(super) finished: tokio::sync::Notify,
}

impl Supervised {
    pub(super) fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Starting),
            pid: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            restarts: AtomicU32::new(0),
            finished: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set_phase(&self, phase: Phase) {
        let mut now = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(phase, Phase::Ready(_)) && matches!(*now, Phase::Reconnecting { .. }) {
            self.restarts.fetch_add(1, Ordering::Relaxed);
        }
        *now = phase;
    }

    pub(super) fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Release);
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Stop: no more starts, and SIGTERM to the engine process if one runs.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.signal(libc::SIGTERM);
    }

    /// Send `sig` to the engine process, if one runs.
    pub(super) fn signal(&self, sig: libc::c_int) {
        let pid = self.pid.load(Ordering::Acquire);
        if pid != 0 {
            // SAFETY: kill(2) touches no memory of ours. The pid is our own
            // child's: the loop clears it as soon as its wait returns.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }

    /// `/health`: ready (200) or why not (503).
    pub(super) fn health(&self) -> (u16, Value) {
        let restarts = self.restarts.load(Ordering::Relaxed);
        match self.phase() {
            Phase::Ready(_) => (200, json!({"status": "ok", "engine_restarts": restarts})),
            Phase::Starting => (503, json!({"status": "starting"})),
            Phase::Reconnecting { reason, attempts } => (
                503,
                json!({"status": "reconnecting", "reason": reason, "attempts": attempts,
                       "engine_restarts": restarts}),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_says_each_phase_and_counts_a_restart_once_it_serves() {
        let s = Supervised::new();
        assert_eq!(s.health(), (503, json!({"status": "starting"})));
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        s.set_phase(Phase::Ready(addr));
        assert_eq!(s.health().1["engine_restarts"], 0);
        s.set_phase(Phase::Reconnecting {
            reason: "an RPC host was lost".into(),
            attempts: 2,
        });
        let (code, h) = s.health();
        assert_eq!((code, h["status"].as_str()), (503, Some("reconnecting")));
        assert_eq!(h["reason"], "an RPC host was lost");
        assert_eq!(h["attempts"], 2);
        s.set_phase(Phase::Ready(addr));
        assert_eq!(
            s.health(),
            (200, json!({"status": "ok", "engine_restarts": 1}))
        );
    }
}
