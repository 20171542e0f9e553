//! A stalled RPC host: ggml's client waits for a reply with a blocking read
//! and no timeout, so a host that stops answering (stopped, overloaded, a
//! network that drops packets silently) would hang the run for good. The
//! watchdog thread watches the bytes to and from the hosts while the run
//! waits on them (the load sending their layers; a decode's remote part,
//! flagged by the engine's clock of it): none for `timeout` ends the run as
//! a lost host
//! ([`super::exit_lost`], exit [`super::EXIT_REMOTE_LOST`]). A host that
//! dies closes its connection instead, which ggml's client meets at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::net::bytes_to;

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(200);
/// Capacity of the stop channel (one message: stop).
const STOP_CAPACITY: usize = 1;

/// The running watchdog; dropping it stops and joins it (within a tick).
pub struct Watchdog {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Watch `peers` while `waiting` says the run waits on them (a load
    /// sending them their layers, a decode's remote part); `timeout` without
    /// a byte moving either way then ends the process.
    pub fn start(
        waiting: Arc<AtomicBool>,
        peers: Vec<SocketAddr>,
        timeout: Duration,
    ) -> Result<Self, super::error::RpcError> {
        let (stop, rx) = bounded(STOP_CAPACITY);
        let thread = std::thread::Builder::new()
            .name("bmoe-rpc-watch".into())
            .spawn(move || watch(&waiting, &peers, timeout, &rx))
            .map_err(|e| super::error::RpcError::Watchdog(e.to_string()))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.stop.try_send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the watchdog decides on one look.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Fine,
    Stalled(Duration),
}

/// The stall clock: restarted by every received byte and outside decodes.
pub(crate) struct StallClock {
    received: u64,
    since: Instant,
}

impl StallClock {
    pub(crate) fn new(received: u64, now: Instant) -> Self {
        Self {
            received,
            since: now,
        }
    }

    pub(crate) fn look(
        &mut self,
        decoding: bool,
        received: u64,
        now: Instant,
        timeout: Duration,
    ) -> Verdict {
        if !decoding || received != self.received {
            self.received = received;
            self.since = now;
            return Verdict::Fine;
        }
        let quiet = now.saturating_duration_since(self.since);
        if quiet >= timeout {
            Verdict::Stalled(quiet)
        } else {
            Verdict::Fine
        }
    }
}

fn watch(waiting: &AtomicBool, peers: &[SocketAddr], timeout: Duration, stop: &Receiver<()>) {
    let moved = || bytes_to(peers).total();
    let mut clock = StallClock::new(moved(), Instant::now());
    loop {
        match stop.recv_timeout(TICK) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let received = bytes_to(peers).received;
        if let Verdict::Stalled(quiet) = clock.look(
            waiting.load(Ordering::Relaxed),
            received,
            Instant::now(),
            timeout,
        ) {
            let hosts: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
            super::exit_lost(&format!(
                "no byte from or to {} for {:.1} s while the run waited on it (--rpc-timeout {})",
                hosts.join(", "),
                quiet.as_secs_f64(),
                timeout.as_secs()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_quiet_decode_past_the_timeout_is_a_stall() {
        let t0 = Instant::now();
        let to = Duration::from_secs(10);
        let mut c = StallClock::new(100, t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(c.look(true, 100, at(5), to), Verdict::Fine);
        // Bytes arrived: the clock restarts.
        assert_eq!(c.look(true, 200, at(9), to), Verdict::Fine);
        assert_eq!(c.look(true, 200, at(18), to), Verdict::Fine);
        assert_eq!(
            c.look(true, 200, at(19), to),
            Verdict::Stalled(Duration::from_secs(10))
        );
        // Idle between decodes is never a stall.
        let mut idle = StallClock::new(0, t0);
        assert_eq!(idle.look(false, 0, at(100), to), Verdict::Fine);
        assert_eq!(idle.look(true, 0, at(105), to), Verdict::Fine);
    }
}
