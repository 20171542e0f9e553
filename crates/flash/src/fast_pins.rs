//! A client's side of the fast path: where its all-hit answers pin slots
//! and queue their touches, and the pins of its last answer.

use std::sync::Arc;

use crossbeam_channel::Sender;

use super::protocol::Touch;
use super::residency::Residency;
use crate::cache::SlotKey;

/// Touches the queue holds; when full the client takes the round trip (the
/// actor then folds the queue in before serving it).
pub(super) const TOUCH_CAPACITY: usize = 1024;

/// A client's side of the fast path.
pub(super) struct FastHits {
    pub(super) residency: Arc<Residency>,
    pub(super) touches: Sender<Touch>,
    /// A verify demand of at most this many experts is one token's routing,
    /// counted for the warm-start profile (0: none is), as the actor counts it.
    pub(super) single_max: u32,
    /// Slots pinned by the last fast answer, held until the next demand.
    pub(super) held: Vec<SlotKey>,
}

impl FastHits {
    pub(super) fn unpin_held(&mut self) {
        for k in self.held.drain(..) {
            self.residency.unpin(k);
        }
    }

    /// Pin every one of `experts`, or none.
    pub(super) fn pin_all(&mut self, layer: u32, experts: &[u32]) -> bool {
        debug_assert!(self.held.is_empty(), "pins left from an earlier answer");
        for &expert in experts {
            let k = SlotKey { layer, expert };
            if !self.residency.pin(k) {
                self.unpin_held();
                return false;
            }
            self.held.push(k);
        }
        true
    }
}

impl Drop for FastHits {
    fn drop(&mut self) {
        self.unpin_held();
    }
}
