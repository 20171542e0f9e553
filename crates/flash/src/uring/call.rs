//! The state of one io_uring `read_all` call: the reads in flight, one per
//! queue slot, and those waiting for room in a full submission queue.

use std::collections::VecDeque;
use std::time::Instant;

use crate::error::FlashError;
use crate::io::{ReadOp, ReadStats};

/// One read in flight.
#[derive(Clone, Copy)]
pub(super) struct Flight {
    pub(super) op: usize,
    /// Read target: the slot itself, or a bounce buffer (index).
    pub(super) bounce: Option<usize>,
    /// File offset and length of the whole read (page-rounded with a bounce).
    pub(super) off: u64,
    pub(super) len: u64,
    pub(super) done: u64,
    pub(super) retries: u32,
    /// When the read was first submitted (for the per-read trace event).
    pub(super) submitted: Instant,
}

/// The state of one `read_all` call.
pub(super) struct Call<'a> {
    pub(super) ops: &'a [ReadOp],
    /// Per queue slot: the read it carries.
    pub(super) flights: Vec<Option<Flight>>,
    pub(super) free_bounce: Vec<usize>,
    /// The next op to submit.
    pub(super) next: usize,
    /// Flights holding a slot: in the ring, or in `unsent`.
    pub(super) in_flight: usize,
    /// Slots whose flight waits for room in a full submission queue (in the
    /// order they were to be pushed): pushed after the next completion.
    pub(super) unsent: VecDeque<usize>,
    /// The first failure: nothing more is submitted, what is in flight drains.
    pub(super) error: Option<FlashError>,
    pub(super) stats: ReadStats,
    pub(super) trace: bool,
}

impl<'a> Call<'a> {
    pub(super) fn new(ops: &'a [ReadOp], depth: usize, bounces: usize) -> Self {
        Self {
            ops,
            flights: vec![None; depth],
            free_bounce: (0..bounces).collect(),
            next: 0,
            in_flight: 0,
            unsent: VecDeque::new(),
            error: None,
            stats: ReadStats {
                ops: ops.len() as u64,
                ..Default::default()
            },
            trace: tracing::enabled!(tracing::Level::DEBUG),
        }
    }

    /// Keep the first failure (later ones are its consequences).
    pub(super) fn fail(&mut self, e: FlashError) {
        self.error.get_or_insert(e);
    }

    /// A flight is over (served or failed): its slot and bounce are free again.
    pub(super) fn retire(&mut self, f: &Flight) {
        if let Some(b) = f.bounce {
            self.free_bounce.push(b);
        }
        self.in_flight -= 1;
    }

    /// Reads the ring holds (submitted or queued in it), whose completions
    /// are still to come.
    pub(super) fn in_ring(&self) -> usize {
        self.in_flight - self.unsent.len()
    }

    /// After a failure: the flights never pushed are over at once (the ring
    /// never saw them).
    pub(super) fn drop_unsent(&mut self) {
        while let Some(slot) = self.unsent.pop_front() {
            if let Some(f) = self.flights[slot].take() {
                self.retire(&f);
            }
        }
    }
}
