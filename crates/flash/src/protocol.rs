//! The message protocol between clients and the flash actor: the messages,
//! the reply to a demand, and the projection phases of a split demand.

use std::time::Duration;

use crossbeam_channel::Sender;

use super::error::FlashError;
use crate::cache::{Requester, SlotKey};
use crate::proj::Proj;

/// The answer to one demand request.
#[derive(Debug, Clone, Default)]
pub struct DemandReply {
    /// Droppable experts that were misses and were not read (only in the first reply).
    pub dropped: Vec<u32>,
    pub hits: u32,
    pub misses: u32,
    pub evictions: u32,
    pub read_bytes: u64,
    pub io_time: Duration,
}

pub(super) enum Msg {
    Demand {
        requester: Requester,
        layer: u32,
        experts: Vec<u32>,
        /// Of `experts`, those to skip when they are not resident (lossy drop).
        droppable: Vec<u32>,
        /// Reply twice: once gate/up are resident, once down is (overlap mode).
        split: bool,
        reply: Sender<Result<DemandReply, FlashError>>,
    },
    /// Read these on idle slots, ahead of their demand (predictive prefetch).
    Prefetch {
        layer: u32,
        experts: Vec<u32>,
    },
    /// Read these for `requester` on idle slots (demands go first), pinned and
    /// counted as its own until its next demand, which drops what is still queued.
    Background {
        requester: Requester,
        layer: u32,
        experts: Vec<u32>,
    },
    /// Warm start: seed the policy's use counts with `rates` (uses per
    /// pass), then read `keys` on idle slots, after every other read, only
    /// into free budget (nothing is evicted for them), unpinned.
    Warm {
        keys: Vec<SlotKey>,
        rates: Vec<(SlotKey, f32)>,
    },
    Release(Requester),
    /// A new byte budget for the cache.
    SetBudget(u64),
    /// Nothing but a wake-up: fold in the touches queued by clients'
    /// fast answers (the actor does before every message).
    Drain,
    /// Stop now (outstanding clients get "stopped" on their next call); the
    /// actor says it is done on `done` before its thread ends.
    Shutdown {
        done: Sender<()>,
    },
}

/// Replies one demand can get (two for a split demand).
pub(super) const REPLY_CAPACITY: usize = 2;

/// Projection indices read in the first phase of a split demand.
pub(super) const GATE_UP: [Proj; 2] = [Proj::Gate, Proj::Up];
pub(super) const DOWN: Proj = Proj::Down;
pub(super) const ALL_PROJ: [Proj; 3] = Proj::ALL;

/// A demand answered by its client: to be folded into the cache's state.
pub(super) struct Touch {
    pub(super) requester: Requester,
    pub(super) layer: u32,
    pub(super) experts: Vec<u32>,
}
