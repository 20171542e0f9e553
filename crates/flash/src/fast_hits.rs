//! All-hit demands without the round trip: a client whose demanded experts
//! are all resident pins them in the shared [`Residency`](super::residency::Residency) and answers itself;
//! what the actor would have done with the demand (the policy's recency and
//! frequency, its pins, the warm-start and prefetch bookkeeping) is queued as
//! a [`Touch`](super::protocol::Touch) on a bounded queue the actor folds in, in order, before any
//! other message or idle step, so every eviction decision sees the same cache
//! state as with the round trip. Hit counters are the client's (atomics).

use std::sync::atomic::Ordering;

use super::actor::Actor;
use super::fast_pins::TOUCH_CAPACITY;
use super::protocol::{Msg, Touch, ALL_PROJ};
use super::{client::FlashClient, protocol::DemandReply};
use crate::cache::{Requester, SlotKey};

impl FlashClient {
    /// Answer a demand of `experts` at `layer` without the flash actor when
    /// every one is resident: they are pinned (never evicted or overwritten)
    /// until this client's next demand, [`end_pass`](Self::end_pass) or drop.
    /// `None` (nothing held) when one is not resident, a split demand's down
    /// slices are pending, the touch queue is full, or this client has no
    /// fast path (read-ahead on: its bookkeeping is time-critical): then take
    /// the round trip ([`demand_with`](Self::demand_with)).
    pub fn try_hits(&mut self, layer: u32, experts: &[u32]) -> Option<DemandReply> {
        if self.down_pending() || experts.is_empty() {
            return None;
        }
        let requester = self.requester;
        let fast = self.fast.as_mut()?;
        fast.unpin_held();
        if !fast.pin_all(layer, experts) {
            return None;
        }
        let touch = Touch {
            requester,
            layer,
            experts: experts.to_vec(),
        };
        if fast.touches.try_send(touch).is_err() {
            fast.unpin_held();
            return None;
        }
        let (c, r, n) = (&self.counters, requester.index(), experts.len());
        c.hits[r].fetch_add(n as u64, Ordering::Relaxed);
        c.requests.fetch_add(1, Ordering::Relaxed);
        if requester == Requester::Verify && fast.single_max > 0 && n <= fast.single_max as usize {
            c.decode_uses.count(layer, experts);
        }
        Some(DemandReply {
            hits: n as u32,
            ..DemandReply::default()
        })
    }

    /// Drop the pins of the last fast answer (before any wait on the actor:
    /// the actor may be waiting for them to evict a slot).
    pub(super) fn unpin_held(&mut self) {
        if let Some(f) = self.fast.as_mut() {
            f.unpin_held();
        }
    }

    /// The requester's pass (a decode) ended: drop the fast answer's pins,
    /// and wake the actor when touches pile up, so it folds them in while
    /// nobody waits on it.
    pub fn end_pass(&mut self) {
        self.unpin_held();
        if self
            .fast
            .as_ref()
            .is_some_and(|f| f.touches.len() >= TOUCH_CAPACITY / 4)
        {
            let _ = self.tx.try_send(Msg::Drain);
        }
    }
}

impl Actor {
    /// Fold in every demand the clients answered themselves, in order.
    pub(super) fn drain_touches(&mut self) {
        while let Ok(t) = self.touches.try_recv() {
            self.touched(t);
        }
    }

    /// What [`Actor::demand`] does with a demand, less the reply and the
    /// counters the client kept: the cache's request (recency, frequency,
    /// pins), the warm slots used, the prefetch bookkeeping.
    fn touched(&mut self, t: Touch) {
        let span = tracing::debug_span!("flash.touch", layer = t.layer, n = t.experts.len());
        let _g = span.enter();
        let keys: Vec<SlotKey> = t
            .experts
            .iter()
            .map(|&expert| SlotKey {
                layer: t.layer,
                expert,
            })
            .collect();
        let plan = self.cache.request(t.requester, &keys);
        if t.requester == Requester::Verify {
            self.note_warm_used(&plan.hits);
        }
        self.make_room(&plan.evict, &plan.misses);
        // Idle work may have evicted a slot between the client's pin and
        // this fold (it waited for the pin): read it back, so what the cache
        // calls resident is.
        if !plan.misses.is_empty() {
            match self.read_misses(&plan.misses, &ALL_PROJ) {
                Ok(stats) => {
                    self.counters.read_bytes[t.requester.index()]
                        .fetch_add(stats.device_bytes, Ordering::Relaxed);
                }
                Err(e) => tracing::debug!("re-reading a touched slot failed (dropped): {e}"),
            }
        }
        let c = &self.counters;
        c.resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
        c.peak_resident_bytes
            .fetch_max(self.cache.peak_resident_bytes(), Ordering::Relaxed);
        if t.requester == Requester::Verify {
            self.after_verify_demand(t.layer, &t.experts);
        }
    }
}
