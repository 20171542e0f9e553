//! The flash actor's state and loop: serve messages in order, demands
//! first, and read the misses of each demand into the arena.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::protocol::{DemandReply, Msg, Touch, ALL_PROJ, DOWN, GATE_UP};
use super::residency::Residency;
use super::{
    arena::Arena, arena::N_PROJ, counters::FlashCounters, error::FlashError, io::ReadOp,
    io::ReadStats, io::SliceReader, watch::FileWatch,
};
use crate::cache::{ExpertCache, Requester, SlotKey};

/// Passes a warm-start profile counts as in the cache's use counts: half an
/// aging period, so the run's own routing outweighs it within a few dozen tokens.
pub(super) const WARM_SEED_PASSES: u32 = crate::cache::AGE_PASSES / 2;
use crate::proj::Proj;

pub(super) struct Actor {
    pub(super) cache: ExpertCache,
    pub(super) n_expert: Vec<u32>,
    /// Bytes of one (layer, expert) slot, all projections.
    pub(super) slot_bytes: Vec<u64>,
    pub(super) arena: Arc<Arena>,
    pub(super) reader: Box<dyn SliceReader>,
    pub(super) counters: Arc<FlashCounters>,
    pub(super) ops: Vec<ReadOp>,
    /// Read-ahead: its settings, the layers' last demands and its work.
    pub(super) ahead: ReadAhead,
    /// Background reads for a requester, oldest first (before prefetch work).
    pub(super) background: VecDeque<(Requester, SlotKey)>,
    /// Pages kept or backed ahead so that a read never lands on fresh pages.
    pub(super) pages: PageStock,
    /// Warm-start work, hottest first (after every other read), and what it
    /// read that no demand hit yet.
    pub(super) warm: VecDeque<SlotKey>,
    pub(super) warm_unused: HashSet<SlotKey>,
    /// The model file's identity at start, checked before demands.
    /// The model's files, watched for replacement or truncation.
    pub(super) watch: Vec<FileWatch>,
    /// Which slots are read, shared with the clients' fast path: set once a
    /// slot's reads completed, cleared (waiting for its readers) before its
    /// pages are released, moved or overwritten.
    pub(super) residency: Arc<Residency>,
    /// Demands the clients answered themselves, folded in before anything else.
    pub(super) touches: Receiver<Touch>,
}

/// The actor's read-ahead (`--prefetch`, `--predict-prefetch`).
pub(super) struct ReadAhead {
    pub(super) layers: u32,
    pub(super) max_experts: u32,
    /// Experts read per idle step (a demand waits at most this long).
    pub(super) chunk: usize,
    /// Per layer: the experts of its last verify demand (temporal prefetch).
    pub(super) history: Vec<Vec<u32>>,
    /// Prefetch work, most urgent first.
    pub(super) queue: VecDeque<SlotKey>,
    /// Read by prefetch, not yet judged by a demand of their layer: bytes.
    pub(super) prefetched: HashMap<SlotKey, u64>,
}

/// Pages for the reads of slots: recycled from evicted slots, or backed ahead.
pub(super) struct PageStock {
    /// Per projection: evicted slots whose pages of it are kept (oldest
    /// first) to be moved under the next misses, so a read never lands on
    /// fresh pages (a fault per page).
    pub(super) spares: [VecDeque<SlotKey>; N_PROJ],
    pub(super) spare_cap: usize,
    /// Pages the toucher backs ahead for slots never used before (None: off).
    pub(super) stock: Option<super::stock::Stock>,
}

impl Actor {
    /// Serve messages in order; while prefetch work is queued and no message
    /// waits, read ahead one small chunk at a time (demands always go first).
    /// Ends on [`Msg::Shutdown`] (returning its `done` sender, to be answered
    /// once the actor's state is dropped) or when every sender is gone.
    pub(super) fn run(mut self, rx: Receiver<Msg>) -> Option<Sender<()>> {
        let done = loop {
            self.drain_touches();
            let idle_work = !self.ahead.queue.is_empty()
                || !self.background.is_empty()
                || !self.warm.is_empty();
            let msg = if !idle_work {
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break None,
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => {
                        if !self.background.is_empty() {
                            self.background_step();
                        } else if !self.ahead.queue.is_empty() {
                            self.prefetch_step();
                        } else {
                            self.warm_step();
                        }
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break None,
                }
            };
            // Touches queued while this message was on its way come first.
            self.drain_touches();
            match msg {
                Msg::Shutdown { done } => break Some(done),
                msg => self.handle(msg),
            }
        };
        if self.reader.in_flight() > 0 {
            // The kernel may still write into slots of the arena: keep it mapped
            // for the rest of the process (one leaked reference).
            std::mem::forget(self.arena.clone());
        }
        drop(self);
        done
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Demand {
                requester,
                layer,
                experts,
                droppable,
                split,
                reply,
            } => {
                let span = tracing::debug_span!("flash.demand", layer, n = experts.len(), split);
                let _g = span.enter();
                if let Err(e) = self.demand(requester, layer, &experts, &droppable, split, &reply) {
                    let _ = reply.send(Err(e));
                }
            }
            Msg::Prefetch { layer, experts } => {
                // Predictions are fresher than history: they go first.
                for &e in experts.iter().rev() {
                    if e >= self.n_expert.get(layer as usize).copied().unwrap_or(0) {
                        continue;
                    }
                    let k = SlotKey { layer, expert: e };
                    if !self.cache.contains(k) && !self.ahead.queue.contains(&k) {
                        self.ahead.queue.push_front(k);
                    }
                }
            }
            Msg::Background {
                requester,
                layer,
                experts,
            } => {
                let limit = self.n_expert.get(layer as usize).copied().unwrap_or(0);
                for e in experts {
                    let k = SlotKey { layer, expert: e };
                    if e < limit && !self.background.contains(&(requester, k)) {
                        self.background.push_back((requester, k));
                    }
                }
            }
            Msg::Warm { keys, rates } => {
                self.cache.seed_counts(WARM_SEED_PASSES, &rates);
                let known = |k: &SlotKey| {
                    k.expert < self.n_expert.get(k.layer as usize).copied().unwrap_or(0)
                };
                let (n, before) = (keys.len(), self.warm.len());
                self.warm.extend(keys.into_iter().filter(known));
                let unknown = (n - (self.warm.len() - before)) as u64;
                let c = &self.counters;
                // Counted before it leaves the queue: a reader who sees the
                // queue empty sees every outcome.
                c.warm.skipped_slots.fetch_add(unknown, Ordering::Relaxed);
                c.warm.queued_slots.fetch_sub(unknown, Ordering::Relaxed);
            }
            Msg::Release(r) => {
                let evicted = self.cache.release(r);
                self.evict(&evicted);
            }
            Msg::SetBudget(bytes) => {
                let evicted = self.cache.set_budget(bytes);
                self.evict(&evicted);
                self.set_stock_room();
            }
            // The touches were folded in before this message.
            Msg::Drain => {}
            // The run loop ends on Shutdown before handling it.
            Msg::Shutdown { .. } => {}
        }
    }

    /// Serve one demand: plan, recycle/evict, read, reply; twice when `split`
    /// (after gate/up, then after down), so down reads overlap the gate/up matmuls.
    fn demand(
        &mut self,
        requester: Requester,
        layer: u32,
        experts: &[u32],
        droppable: &[u32],
        split: bool,
        reply: &Sender<Result<DemandReply, FlashError>>,
    ) -> Result<(), FlashError> {
        for w in &mut self.watch {
            w.check()?;
        }
        let limit = self.n_expert.get(layer as usize).copied().unwrap_or(0);
        if let Some(&bad) = experts.iter().find(|&&e| e >= limit) {
            return Err(FlashError::UnknownExpert { layer, expert: bad });
        }
        let (keys, mut dropped) = self.drop_cold(layer, experts, droppable);
        // The requester's pass has begun: what it asked for in the background
        // and is still queued is read now if it needs it, else not at all.
        self.background.retain(|(r, _)| *r != requester);
        let plan = self.cache.request(requester, &keys);
        if requester == Requester::Verify {
            self.note_demand_hits(layer, experts, &plan.hits);
        }
        self.make_room(&plan.evict, &plan.misses);
        let phases: &[&[Proj]] = if split {
            &[&GATE_UP, &[DOWN]]
        } else {
            &[&ALL_PROJ]
        };
        for (i, projs) in phases.iter().enumerate() {
            let stats = self.read_misses(&plan.misses, projs)?;
            let first = i == 0;
            let c = &self.counters;
            let r = requester.index();
            c.read_bytes[r].fetch_add(stats.device_bytes, Ordering::Relaxed);
            c.io_ns
                .fetch_add(stats.elapsed.as_nanos() as u64, Ordering::Relaxed);
            if first {
                c.hits[r].fetch_add(plan.hits.len() as u64, Ordering::Relaxed);
                c.misses[r].fetch_add(plan.misses.len() as u64, Ordering::Relaxed);
                c.requests.fetch_add(1, Ordering::Relaxed);
            }
            c.resident_bytes
                .store(self.cache.resident_bytes(), Ordering::Relaxed);
            c.peak_resident_bytes
                .fetch_max(self.cache.peak_resident_bytes(), Ordering::Relaxed);
            let counted = |n: usize| if first { n as u32 } else { 0 };
            let _ = reply.send(Ok(DemandReply {
                dropped: if first {
                    std::mem::take(&mut dropped)
                } else {
                    Vec::new()
                },
                hits: counted(plan.hits.len()),
                misses: counted(plan.misses.len()),
                evictions: counted(plan.evict.len()),
                read_bytes: stats.device_bytes,
                io_time: stats.elapsed,
            }));
        }
        if requester == Requester::Verify {
            let served: Vec<u32> = keys.iter().map(|k| k.expert).collect();
            self.after_verify_demand(layer, &served);
        }
        Ok(())
    }

    /// The slots a demand serves, and the `droppable` experts left out of it
    /// because they are not resident (counted as dropped).
    fn drop_cold(
        &self,
        layer: u32,
        experts: &[u32],
        droppable: &[u32],
    ) -> (Vec<SlotKey>, Vec<u32>) {
        let (dropped, keys): (Vec<SlotKey>, Vec<SlotKey>) = experts
            .iter()
            .map(|&expert| SlotKey { layer, expert })
            .partition(|k| droppable.contains(&k.expert) && !self.cache.contains(*k));
        self.counters
            .dropped_experts
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        (keys, dropped.into_iter().map(|k| k.expert).collect())
    }

    /// Read the `projs` slices of every miss.
    pub(super) fn read_misses(
        &mut self,
        misses: &[SlotKey],
        projs: &[Proj],
    ) -> Result<ReadStats, FlashError> {
        if let Some(what) = self.arena.lost() {
            return Err(FlashError::MappingLost(what.clone()));
        }
        self.ops.clear();
        for k in misses {
            for &p in projs {
                if let Some((dst, file_offset, len)) = self.arena.slot(k.layer, p, k.expert) {
                    self.ops.push(ReadOp {
                        dst,
                        file_offset,
                        len,
                    });
                }
            }
        }
        if self.ops.is_empty() {
            return Ok(ReadStats::default());
        }
        let layer = misses.first().map_or(0, |k| k.layer);
        let span = tracing::debug_span!("flash.read", layer, slices = self.ops.len());
        let _g = span.enter();
        // Every op targets a slot of a key that this plan just marked
        // resident (a miss): no matmul reads it until we reply, and no other op
        // in the batch overlaps it (distinct experts and projections).
        let faults = thread_minor_faults();
        // SAFETY: as the comment above says.
        let read = unsafe { self.reader.read_all(&self.ops) };
        self.counters.touch.read_faults.fetch_add(
            thread_minor_faults().saturating_sub(faults),
            Ordering::Relaxed,
        );
        if read.is_ok() && projs.contains(&DOWN) {
            // Every projection is read now (gate/up came first when split):
            // the clients' fast path may answer these slots.
            for &k in misses {
                self.residency.publish(k);
            }
        }
        read.inspect_err(|_| {
            // Whatever was partially read must not be taken for resident.
            for k in misses {
                for p in Proj::ALL {
                    self.arena.release(k.layer, p, k.expert);
                }
            }
            self.cache.forget(misses);
        })
    }
}

/// Minor page faults the calling thread has taken so far (0 where the
/// kernel does not say).
fn thread_minor_faults() -> u64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_minflt as u64
}
