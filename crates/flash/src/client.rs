//! The owner's handle ([`Flash`]: spawns the actor, hands out clients, shuts
//! it down) and a requester's connection to the actor ([`FlashClient`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use super::actor::{Actor, PageStock, ReadAhead};
use super::fast_pins::{FastHits, TOUCH_CAPACITY};
use super::protocol::Touch;
use super::protocol::{Msg, REPLY_CAPACITY};
use super::recycle::SPARE_MAX_BYTES;
use super::residency::Residency;
use super::stock::Stock;
use super::{
    arena::Arena, arena::TensorSpec, arena::N_PROJ, config::FlashConfig, counters::FlashCounters,
    error::FlashError, io::SliceReader, open::ReaderNote, protocol::DemandReply,
    shards::open_files, shards::ShardFile, watch::FileWatch, watch::CHECK_INTERVAL,
};
use crate::cache::{ExpertCache, Requester, SlotKey};

/// Capacity of the shutdown's reply channel: the actor's one "done".
const DONE_CAPACITY: usize = 1;

/// Owner's handle: spawns the actor, hands out clients, shuts it down.
pub struct Flash {
    tx: Option<Sender<Msg>>,
    join: Option<JoinHandle<()>>,
    counters: Arc<FlashCounters>,
    arena: Arc<Arena>,
    reader_desc: String,
    /// Whether the reader bypasses the page cache (O_DIRECT).
    o_direct: bool,
    notes: Vec<ReaderNote>,
    residency: Arc<Residency>,
    touch_tx: Sender<Touch>,
    /// Whether clients may answer all-hit demands themselves: not with
    /// temporal prefetch, whose queue follows each demand as it is served.
    fast_hits: bool,
    single_max: u32,
}

/// A requester's connection to the flash actor (one per thread).
pub struct FlashClient {
    pub(super) tx: Sender<Msg>,
    /// Replies to the last demand. Each demand gets a fresh channel whose only
    /// sender travels with the message, so if the actor dies the sender is
    /// dropped and the wait ends with an error instead of hanging.
    reply_rx: Receiver<Result<DemandReply, FlashError>>,
    pub(super) requester: Requester,
    /// A split demand whose down slices have not been waited for yet.
    down_pending: bool,
    pub(super) counters: Arc<FlashCounters>,
    /// All-hit demands answered without the actor ([`FlashClient::try_hits`]).
    pub(super) fast: Option<FastHits>,
}

impl FlashClient {
    fn send(
        &mut self,
        layer: u32,
        experts: &[u32],
        droppable: &[u32],
        split: bool,
    ) -> Result<(), FlashError> {
        // The actor may be waiting for these pins to evict a slot.
        self.unpin_held();
        let (reply, reply_rx) = bounded(REPLY_CAPACITY);
        self.reply_rx = reply_rx;
        self.tx
            .send(Msg::Demand {
                requester: self.requester,
                layer,
                experts: experts.to_vec(),
                droppable: droppable.to_vec(),
                split,
                reply,
            })
            .map_err(|_| FlashError::RequestsClosed)
    }

    /// The general demand: the `droppable` experts may be skipped when they
    /// are not resident (`--drop-cold-experts`; the reply lists the skipped
    /// ones), `split` as in [`demand_gate_up`](Self::demand_gate_up), and a
    /// read-ahead `hint` (layer, experts) queued right behind the demand, so
    /// the flash actor starts on it as soon as the demand is served, without
    /// waiting to be woken while the compute threads hold every core.
    pub fn demand_with(
        &mut self,
        layer: u32,
        experts: &[u32],
        droppable: &[u32],
        split: bool,
        hint: Option<(u32, &[u32])>,
    ) -> Result<DemandReply, FlashError> {
        self.wait_down()?;
        self.send(layer, experts, droppable, split)?;
        if let Some((l, e)) = hint {
            self.prefetch(l, e);
        }
        let r = self.recv()?;
        self.down_pending = split;
        Ok(r)
    }

    /// The flash actor's shared counters.
    pub fn counters(&self) -> &Arc<FlashCounters> {
        &self.counters
    }

    /// Ask for `experts` of `layer` to be read for this requester in the
    /// background: only while no demand waits (a chunk at a time, demands of
    /// every requester go first), pinned as this requester's until its next
    /// demand, counted in its bytes and in `background_read_bytes`. Never blocks:
    /// when the request channel is full the request is dropped and counted as a
    /// dropped hint.
    pub fn background(&self, layer: u32, experts: &[u32]) {
        self.hint(Msg::Background {
            requester: self.requester,
            layer,
            experts: experts.to_vec(),
        });
    }

    /// Ask for `experts` of `layer` to be read ahead on idle queue slots. Never
    /// blocks: when the request channel is full the hint is dropped and counted.
    pub fn prefetch(&self, layer: u32, experts: &[u32]) {
        self.hint(Msg::Prefetch {
            layer,
            experts: experts.to_vec(),
        });
    }

    /// Send work the actor may do when idle; never blocks (dropped and counted
    /// when the request channel is full).
    fn hint(&self, msg: Msg) {
        if self.tx.try_send(msg).is_err() {
            self.counters
                .prefetch
                .hints_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn recv(&self) -> Result<DemandReply, FlashError> {
        self.reply_rx.recv().map_err(|_| FlashError::NoReply)?
    }

    /// Block until `experts` of `layer` are resident (and pinned for this requester).
    pub fn demand(&mut self, layer: u32, experts: &[u32]) -> Result<DemandReply, FlashError> {
        self.wait_down()?;
        self.send(layer, experts, &[], false)?;
        self.recv()
    }

    /// Overlap mode: block until the gate and up slices of `experts` are
    /// resident while the down slices keep loading; call [`wait_down`] before
    /// the down matmul.
    ///
    /// [`wait_down`]: FlashClient::wait_down
    pub fn demand_gate_up(
        &mut self,
        layer: u32,
        experts: &[u32],
    ) -> Result<DemandReply, FlashError> {
        self.wait_down()?;
        self.send(layer, experts, &[], true)?;
        let r = self.recv()?;
        self.down_pending = true;
        Ok(r)
    }

    /// Block until the down slices of the last split demand are resident
    /// (returns at once when none is pending).
    pub fn wait_down(&mut self) -> Result<DemandReply, FlashError> {
        if !std::mem::take(&mut self.down_pending) {
            return Ok(DemandReply::default());
        }
        self.unpin_held();
        self.recv()
    }

    /// Whether a split demand still has down slices in flight.
    pub fn down_pending(&self) -> bool {
        self.down_pending
    }

    /// Drop this requester's pins (its decode is over).
    pub fn release(&mut self) {
        self.unpin_held();
        let _ = self.tx.send(Msg::Release(self.requester));
    }
}

impl Flash {
    /// Open the model's file (or the shards of a split model, at their bases
    /// in the specs' offsets) for reads, reserve the arena and start the
    /// actor thread.
    pub fn spawn(
        files: &[ShardFile],
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
    ) -> Result<Self, FlashError> {
        let max_slice = specs.iter().map(|s| s.slice_bytes).max().unwrap_or(0);
        let (reader, notes) = open_files(files, cfg.o_direct, cfg.queue_depth, max_slice)?;
        let paths: Vec<&Path> = files.iter().map(|f| f.path.as_path()).collect();
        Self::spawn_with_reader(reader, notes, specs, cfg, &paths)
    }

    /// As [`Flash::spawn`] with a given reader (fault injection in tests);
    /// the files in `watched` are watched for replacement or truncation.
    pub fn spawn_with_reader(
        reader: Box<dyn SliceReader>,
        notes: Vec<ReaderNote>,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
        watched: &[&Path],
    ) -> Result<Self, FlashError> {
        let watch = watched
            .iter()
            .map(|m| FileWatch::new(m, CHECK_INTERVAL))
            .collect::<Result<_, _>>()?;
        Self::spawn_inner(reader, notes, specs, cfg, watch)
    }

    fn spawn_inner(
        reader: Box<dyn SliceReader>,
        notes: Vec<ReaderNote>,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
        watch: Vec<FileWatch>,
    ) -> Result<Self, FlashError> {
        let arena = Arc::new(Arena::new(&specs)?);
        let n_layer = specs
            .iter()
            .map(|s| s.layer as usize + 1)
            .max()
            .unwrap_or(0);
        let mut slot_bytes = vec![0u64; n_layer];
        let mut n_expert = vec![0u32; n_layer];
        for s in &specs {
            slot_bytes[s.layer as usize] += s.slice_bytes;
            n_expert[s.layer as usize] = n_expert[s.layer as usize].max(s.n_expert);
        }
        let widest = n_expert.iter().copied().max().unwrap_or(0) as usize;
        let counters = Arc::new(FlashCounters::with_slots(n_layer, widest));
        let (tx, rx) = bounded::<Msg>(cfg.request_capacity.max(1));
        let (touch_tx, touches) = bounded::<Touch>(TOUCH_CAPACITY);
        let residency = Arc::new(Residency::new(n_layer, widest));
        let reader_desc = reader.describe();
        let o_direct = reader.direct();
        let mut state = Actor {
            cache: ExpertCache::with_policy(cfg.budget_bytes, slot_bytes.clone(), cfg.policy),
            n_expert,
            slot_bytes,
            arena: arena.clone(),
            reader,
            counters: counters.clone(),
            ops: Vec::new(),
            ahead: ReadAhead {
                layers: cfg.prefetch_layers,
                max_experts: cfg.prefetch_max_experts,
                chunk: (cfg.queue_depth as usize / N_PROJ).max(1),
                history: vec![Vec::new(); n_layer],
                queue: VecDeque::new(),
                prefetched: HashMap::new(),
            },
            background: VecDeque::new(),
            pages: PageStock {
                spares: Default::default(),
                spare_cap: 0,
                stock: None,
            },
            warm: VecDeque::new(),
            warm_unused: HashSet::new(),
            watch,
            residency: residency.clone(),
            touches,
        };
        let max_slot = state.slot_bytes.iter().copied().max().unwrap_or(0).max(1);
        // A prompt's batch evicts a whole layer while the next one is read
        // ahead: up to a layer's slots are kept to take those reads.
        let widest = state.n_expert.iter().copied().max().unwrap_or(0) as usize;
        state.pages.spare_cap = ((SPARE_MAX_BYTES / max_slot) as usize).max(widest).max(4);
        let widest_slice = specs.iter().map(|s| s.slice_bytes).max().unwrap_or(0);
        let cell_bytes = arena.pages_of(widest_slice);
        state.pages.stock = Stock::new(cfg.pretouch_bytes, cell_bytes, state.counters.clone())?;
        state.set_stock_room();
        let join = std::thread::Builder::new()
            .name("bmoe-flash".into())
            .spawn(move || {
                if let Some(done) = state.run(rx) {
                    let _ = done.send(());
                }
            })
            .map_err(|e| FlashError::Os {
                what: "spawn the flash thread".into(),
                source: e,
            })?;
        Ok(Self {
            tx: Some(tx),
            join: Some(join),
            counters,
            arena,
            reader_desc,
            o_direct,
            notes,
            residency,
            touch_tx,
            fast_hits: cfg.prefetch_layers == 0,
            single_max: cfg.prefetch_max_experts,
        })
    }

    pub fn client(&self, requester: Requester) -> FlashClient {
        // No demand yet: a channel whose sender is already gone.
        let (_, reply_rx) = bounded(REPLY_CAPACITY);
        FlashClient {
            tx: self.tx.clone().expect("flash running"),
            reply_rx,
            requester,
            down_pending: false,
            counters: self.counters.clone(),
            fast: self.fast_hits.then(|| FastHits {
                residency: self.residency.clone(),
                touches: self.touch_tx.clone(),
                single_max: self.single_max,
                held: Vec::new(),
            }),
        }
    }

    pub fn counters(&self) -> &Arc<FlashCounters> {
        &self.counters
    }

    /// Change the cache's byte budget (`--cache-mb auto`, decided once the
    /// contexts exist); a smaller one evicts down to it at once.
    pub fn set_budget(&self, bytes: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::SetBudget(bytes));
        }
    }

    /// Warm start: seed the cache policy's use counts with `rates` (an
    /// earlier run's uses per pass), and read `keys` (hottest first) when the
    /// actor is idle, after demands and read-ahead, only into free budget.
    /// False when the request channel is full (nothing done).
    pub fn warm(&self, keys: Vec<SlotKey>, rates: Vec<(SlotKey, f32)>) -> bool {
        let n = keys.len() as u64;
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(Msg::Warm { keys, rates }).is_ok());
        if sent {
            self.counters
                .warm
                .queued_slots
                .fetch_add(n, Ordering::Relaxed);
        }
        sent
    }

    /// The slots resident now, layer-major (what a restart may read back:
    /// [`FlashClient::warm`]).
    pub fn resident_slots(&self) -> Vec<SlotKey> {
        self.residency.resident_keys()
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// Notes about fallbacks taken at start (O_DIRECT refused, no io_uring).
    pub fn notes(&self) -> &[ReaderNote] {
        &self.notes
    }

    pub fn reader_description(&self) -> &str {
        &self.reader_desc
    }

    /// Whether expert reads bypass the page cache (O_DIRECT was granted).
    pub fn o_direct(&self) -> bool {
        self.o_direct
    }

    /// Stop the actor: a shutdown message (after the requests already queued),
    /// then a join once it says it is done, all within `deadline`. Clients still
    /// held get "the flash actor has stopped" on their next call. Returns false
    /// when the actor did not stop in time (it is then left running, detached)
    /// or had panicked.
    pub fn shutdown(mut self, deadline: Duration) -> bool {
        self.stop(deadline)
    }

    fn stop(&mut self, deadline: Duration) -> bool {
        let (Some(tx), Some(join)) = (self.tx.take(), self.join.take()) else {
            return true;
        };
        let t0 = Instant::now();
        let (done_tx, done_rx) = bounded::<()>(DONE_CAPACITY);
        // The request channel is bounded: wait for room, at most the deadline.
        // A send to an actor that is already gone fails at once; `done_rx` then
        // sees its sender dropped, and the join below reports how it ended.
        if let Err(SendTimeoutError::Timeout(_)) =
            tx.send_timeout(Msg::Shutdown { done: done_tx }, deadline)
        {
            tracing::warn!("flash actor did not take its shutdown within {deadline:?}");
            return false;
        }
        drop(tx);
        match done_rx.recv_timeout(deadline.saturating_sub(t0.elapsed())) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => join.join().is_ok(),
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!("flash actor did not stop within {deadline:?}");
                false
            }
        }
    }
}

impl Drop for Flash {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}
