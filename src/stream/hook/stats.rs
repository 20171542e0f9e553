//! What the hook measured ([`StepStats`]), shared with the engine on the same
//! thread.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// What the hook measured since the last [`StepStats::take`].
#[derive(Debug, Default, Clone)]
pub struct StepStats {
    pub stall: Duration,
    pub io: Duration,
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub demands: u64,
    /// Bytes the flash actor read ahead (prefetch) since the last take; also in `read_bytes`.
    pub prefetch_bytes: u64,
    /// Routed experts skipped by `--drop-cold-experts`.
    pub dropped: u64,
    /// Predictive prefetch: experts guessed, and how many the real routing used.
    pub predicted: u64,
    pub predicted_used: u64,
    /// First error met inside a callback (the decode was aborted because of it).
    pub error: Option<String>,
    /// Every demand's layer and experts, in order (only with
    /// [`StreamHook::with_route_log`](super::StreamHook::with_route_log): the
    /// MTP head's hook, whose drafting pass predicts its catch-up pass).
    pub routed: Vec<(u32, Vec<u32>)>,
}

impl StepStats {
    pub fn take(&mut self) -> StepStats {
        let error = self.error.clone();
        let mut s = std::mem::take(self);
        self.error = error.clone();
        s.error = error;
        s
    }
}

/// Shared between the hook (inside the context) and the engine on the same thread.
pub type SharedStats = Rc<RefCell<StepStats>>;
