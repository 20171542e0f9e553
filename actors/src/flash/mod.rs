//! The flash actor: owns the reader (io_uring) and the expert cache, serves
//! demand requests ("layer L needs experts {..}, reply when resident"), evicts
//! under the byte budget, and counts bytes, hits and misses per requester.

mod arena;
mod fault;
mod io;
mod probe;
mod uring;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};

pub use arena::{AnonBuffer, Arena, TensorSpec, N_PROJ};
pub use fault::{
    open_faulty_reader, FaultCounts, FaultPlan, FaultReader, FaultyReader, FaultyRing, FaultySource,
};
pub use io::{open_reader, PreadReader, RawSource, ReadOp, ReadStats, SliceReader};
pub use probe::{probe_read_bandwidth, ProbeResult};
pub use uring::{KernelRing, Ring, UringReader};
pub use watch::{FileWatch, CHECK_INTERVAL};

use crate::cache::{ExpertCache, Requester, SlotKey};

/// Errors of the flash actor and its reader.
#[derive(Debug, thiserror::Error)]
pub enum FlashError {
    #[error("cannot open {path} for expert reads: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path} at offset {offset} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} ends before offset {offset}: the model file was truncated or replaced while running")]
    ShortFile { path: PathBuf, offset: u64 },
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the model file {path} was {what} while running; the run stops rather than mix two \
         files' weights (restart bmoe to use the file as it is now)"
    )]
    Changed { path: PathBuf, what: String },
    #[error(
        "the io_uring queue reading {path} stopped answering ({source}) with reads in flight; \
         the run stops"
    )]
    Wedged {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("flash configuration: {0}")]
    Config(String),
    #[error("the flash actor has stopped: {0}")]
    Stopped(String),
    /// A demand the actor could not serve (its reads failed); the actor goes on.
    #[error("{0}")]
    Failed(String),
    #[error("layer {layer} expert {expert} is not a streamed expert of this model")]
    UnknownExpert { layer: u32, expert: u32 },
}

/// Settings of the flash actor.
#[derive(Debug, Clone)]
pub struct FlashConfig {
    /// Hard byte budget of the expert cache (0: only the working set).
    pub budget_bytes: u64,
    /// io_uring queue depth (`--io-threads`).
    pub queue_depth: u32,
    /// Read with O_DIRECT (falls back with a note where refused).
    pub o_direct: bool,
    /// Capacity of the request channel.
    pub request_capacity: usize,
    /// Temporal prefetch (`--prefetch K`): after serving layer L, read on idle
    /// queue slots what layers L+1..L+K used the last time they were asked.
    pub prefetch_layers: u32,
    /// Remember a layer's demand for temporal prefetch only when it names at
    /// most this many experts (a single token's routing; 0: always).
    pub prefetch_max_experts: u32,
}

impl Default for FlashConfig {
    fn default() -> Self {
        Self {
            budget_bytes: 0,
            queue_depth: 4,
            o_direct: true,
            request_capacity: 16,
            prefetch_layers: 0,
            prefetch_max_experts: 0,
        }
    }
}

/// Counters shared (read-only outside the actor) as atomics.
#[derive(Debug, Default)]
pub struct FlashCounters {
    pub read_bytes: [AtomicU64; Requester::COUNT],
    pub hits: [AtomicU64; Requester::COUNT],
    pub misses: [AtomicU64; Requester::COUNT],
    pub evictions: AtomicU64,
    pub requests: AtomicU64,
    pub io_ns: AtomicU64,
    pub resident_bytes: AtomicU64,
    pub peak_resident_bytes: AtomicU64,
    /// Prefetched bytes that the next demand of their layer used.
    pub prefetch_useful_bytes: AtomicU64,
    /// Prefetched bytes that the next demand of their layer did not ask for
    /// (or that were evicted before it came).
    pub prefetch_wasted_bytes: AtomicU64,
    /// Prefetch hints not sent because the request channel was full.
    pub prefetch_hints_dropped: AtomicU64,
    /// Prefetch reads that failed (dropped; a demand re-reads and reports).
    pub prefetch_errors: AtomicU64,
    /// Routed experts skipped by `--drop-cold-experts` (misses only).
    pub dropped_experts: AtomicU64,
    /// Bytes read for background requests ([`FlashClient::background`]), also
    /// in their requester's `read_bytes`.
    pub background_read_bytes: AtomicU64,
}

impl FlashCounters {
    pub fn read_bytes_total(&self) -> u64 {
        self.read_bytes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

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

enum Msg {
    Demand {
        requester: Requester,
        layer: u32,
        experts: Vec<u32>,
        /// Of `experts`, those to skip when they are not resident (lossy drop).
        droppable: Vec<u32>,
        /// Reply twice: once gate/up are resident, once down is (overlap mode).
        split: bool,
        reply: Sender<Result<DemandReply, String>>,
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
    Release(Requester),
}

/// Replies one demand can get (two for a split demand).
const REPLY_CAPACITY: usize = 2;

/// Projection indices read in the first phase of a split demand.
const GATE_UP: [u8; 2] = [0, 1];
const DOWN: u8 = 2;
const ALL_PROJ: [u8; 3] = [0, 1, 2];

/// Owner's handle: spawns the actor, hands out clients, shuts it down.
pub struct Flash {
    tx: Option<Sender<Msg>>,
    join: Option<JoinHandle<()>>,
    counters: Arc<FlashCounters>,
    arena: Arc<Arena>,
    reader_desc: String,
    notes: Vec<String>,
}

/// A requester's connection to the flash actor (one per thread).
pub struct FlashClient {
    tx: Sender<Msg>,
    /// Replies to the last demand. Each demand gets a fresh channel whose only
    /// sender travels with the message, so if the actor dies the sender is
    /// dropped and the wait ends with an error instead of hanging.
    reply_rx: Receiver<Result<DemandReply, String>>,
    requester: Requester,
    /// A split demand whose down slices have not been waited for yet.
    down_pending: bool,
    counters: Arc<FlashCounters>,
}

impl FlashClient {
    fn send(
        &mut self,
        layer: u32,
        experts: &[u32],
        droppable: &[u32],
        split: bool,
    ) -> Result<(), FlashError> {
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
            .map_err(|_| FlashError::Stopped("request channel closed".into()))
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
                .prefetch_hints_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn recv(&self) -> Result<DemandReply, FlashError> {
        self.reply_rx
            .recv()
            .map_err(|_| FlashError::Stopped("no reply".into()))?
            .map_err(FlashError::Failed)
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
        self.recv()
    }

    /// Whether a split demand still has down slices in flight.
    pub fn down_pending(&self) -> bool {
        self.down_pending
    }

    /// Drop this requester's pins (its decode is over).
    pub fn release(&self) {
        let _ = self.tx.send(Msg::Release(self.requester));
    }
}

impl Flash {
    /// Open the model file for reads, reserve the arena and start the actor thread.
    pub fn spawn(
        model: &Path,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
    ) -> Result<Self, FlashError> {
        let max_slice = specs.iter().map(|s| s.slice_bytes).max().unwrap_or(0);
        let (reader, notes) = open_reader(model, cfg.o_direct, cfg.queue_depth, max_slice)?;
        let watch = FileWatch::new(model, CHECK_INTERVAL)?;
        Self::spawn_inner(reader, notes, specs, cfg, Some(watch))
    }

    /// As [`Flash::spawn`] with a given reader (fault injection in tests);
    /// `model`, when given, is watched for replacement or truncation.
    pub fn spawn_with_reader(
        reader: Box<dyn SliceReader>,
        notes: Vec<String>,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
        model: Option<&Path>,
    ) -> Result<Self, FlashError> {
        let watch = model
            .map(|m| FileWatch::new(m, CHECK_INTERVAL))
            .transpose()?;
        Self::spawn_inner(reader, notes, specs, cfg, watch)
    }

    fn spawn_inner(
        reader: Box<dyn SliceReader>,
        notes: Vec<String>,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
        watch: Option<FileWatch>,
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
        let counters = Arc::new(FlashCounters::default());
        let (tx, rx) = bounded::<Msg>(cfg.request_capacity.max(1));
        let reader_desc = reader.describe();
        let mut state = Actor {
            cache: ExpertCache::new(cfg.budget_bytes, slot_bytes.clone()),
            n_expert,
            slot_bytes,
            arena: arena.clone(),
            reader,
            counters: counters.clone(),
            ops: Vec::new(),
            prefetch_layers: cfg.prefetch_layers,
            prefetch_max_experts: cfg.prefetch_max_experts,
            prefetch_chunk: (cfg.queue_depth as usize / N_PROJ).max(1),
            history: vec![Vec::new(); n_layer],
            queue: VecDeque::new(),
            background: VecDeque::new(),
            prefetched: HashMap::new(),
            spares: VecDeque::new(),
            spare_cap: 0,
            watch,
        };
        let max_slot = state.slot_bytes.iter().copied().max().unwrap_or(0).max(1);
        state.spare_cap = (SPARE_MAX_BYTES / max_slot).max(4) as usize;
        let join = std::thread::Builder::new()
            .name("bmoe-flash".into())
            .spawn(move || state.run(rx))
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
            notes,
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
        }
    }

    pub fn counters(&self) -> &Arc<FlashCounters> {
        &self.counters
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// Notes about fallbacks taken at start (O_DIRECT refused, no io_uring).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn reader_description(&self) -> &str {
        &self.reader_desc
    }

    /// Stop the actor: close the channel (clients must be dropped first for it to
    /// see the end) and join it within `deadline`. Returns false on timeout.
    pub fn shutdown(mut self, deadline: Duration) -> bool {
        self.stop(deadline)
    }

    fn stop(&mut self, deadline: Duration) -> bool {
        drop(self.tx.take());
        let Some(j) = self.join.take() else {
            return true;
        };
        let t0 = Instant::now();
        while !j.is_finished() {
            if t0.elapsed() > deadline {
                tracing::warn!("flash actor did not stop within {deadline:?}");
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        j.join().is_ok()
    }
}

impl Drop for Flash {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

const MAX_RECYCLED_SLOTS: usize = 12_000;

struct Actor {
    cache: ExpertCache,
    n_expert: Vec<u32>,
    /// Bytes of one (layer, expert) slot, all projections.
    slot_bytes: Vec<u64>,
    arena: Arc<Arena>,
    reader: Box<dyn SliceReader>,
    counters: Arc<FlashCounters>,
    ops: Vec<ReadOp>,
    prefetch_layers: u32,
    prefetch_max_experts: u32,
    /// Experts read per idle step (a demand waits at most this long).
    prefetch_chunk: usize,
    /// Per layer: the experts of its last verify demand (temporal prefetch).
    history: Vec<Vec<u32>>,
    /// Prefetch work, most urgent first.
    queue: VecDeque<SlotKey>,
    /// Background reads for a requester, oldest first (before prefetch work).
    background: VecDeque<(Requester, SlotKey)>,
    /// Read by prefetch, not yet judged by a demand of their layer: bytes.
    prefetched: HashMap<SlotKey, u64>,
    /// Evicted slots whose pages are kept (oldest first) to be moved under the
    /// next misses, so a read never lands on fresh pages (a fault per page).
    spares: VecDeque<SlotKey>,
    spare_cap: usize,
    /// The model file's identity at start, checked before demands.
    watch: Option<FileWatch>,
}

/// Evicted pages kept for reuse, at most (they count in RSS, not in the cache).
pub const SPARE_MAX_BYTES: u64 = 32 * 1024 * 1024;

impl Actor {
    /// Serve messages in order; while prefetch work is queued and no message
    /// waits, read ahead one small chunk at a time (demands always go first).
    fn run(&mut self, rx: Receiver<Msg>) {
        loop {
            let msg = if self.queue.is_empty() && self.background.is_empty() {
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => {
                        if self.background.is_empty() {
                            self.prefetch_step();
                        } else {
                            self.background_step();
                        }
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            self.handle(msg);
        }
        if self.reader.in_flight() > 0 {
            // The kernel may still write into slots of the arena: keep it mapped
            // for the rest of the process (one leaked reference).
            std::mem::forget(self.arena.clone());
        }
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
                    let _ = reply.send(Err(e.to_string()));
                }
            }
            Msg::Prefetch { layer, experts } => {
                // Predictions are fresher than history: they go first.
                for &e in experts.iter().rev() {
                    if e >= self.n_expert.get(layer as usize).copied().unwrap_or(0) {
                        continue;
                    }
                    let k = SlotKey { layer, expert: e };
                    if !self.cache.contains(k) && !self.queue.contains(&k) {
                        self.queue.push_front(k);
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
            Msg::Release(r) => {
                let evicted = self.cache.release(r);
                self.evict(&evicted);
            }
        }
    }

    /// Read one chunk of background work, for the requester at its head.
    fn background_step(&mut self) {
        let Some(&(owner, _)) = self.background.front() else {
            return;
        };
        let mut keys = Vec::with_capacity(self.prefetch_chunk);
        while keys.len() < self.prefetch_chunk {
            match self.background.front() {
                Some(&(r, k)) if r == owner => {
                    self.background.pop_front();
                    keys.push(k);
                }
                _ => break,
            }
        }
        let span = tracing::debug_span!(
            "flash.background",
            requester = owner.name(),
            layer = keys[0].layer,
            n = keys.len()
        );
        let _g = span.enter();
        // Pinned as the owner's (hits too), so they stay until its next demand.
        let plan = self.cache.request_more(owner, &keys);
        self.make_room(&plan.evict, &plan.misses);
        match self.read_misses(&plan.misses, &ALL_PROJ) {
            Ok(stats) => {
                self.count_idle_read(owner, &stats);
                self.counters
                    .background_read_bytes
                    .fetch_add(stats.device_bytes, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!("background read failed (dropped, a demand will retry): {e}");
                self.counters
                    .prefetch_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn n_layer(&self) -> u32 {
        self.history.len() as u32
    }

    /// Layers a prefetch may still help once `layer` has been demanded.
    fn in_window(&self, layer: u32, candidate: u32) -> bool {
        let n = self.n_layer().max(1);
        let ahead = (candidate + n - layer % n) % n;
        ahead >= 1 && ahead <= self.prefetch_layers.max(1)
    }

    /// A verify demand of `layer` arrived: judge what was prefetched for it,
    /// drop stale queued work, queue the next layers' history.
    fn after_verify_demand(&mut self, layer: u32, experts: &[u32]) {
        let judged: Vec<SlotKey> = self
            .prefetched
            .keys()
            .filter(|k| k.layer == layer)
            .copied()
            .collect();
        let mut unused = Vec::new();
        for k in judged {
            let bytes = self.prefetched.remove(&k).unwrap_or(0);
            let c = if experts.contains(&k.expert) {
                &self.counters.prefetch_useful_bytes
            } else {
                unused.push(k);
                &self.counters.prefetch_wasted_bytes
            };
            c.fetch_add(bytes, Ordering::Relaxed);
        }
        // A wrong guess must not push useful slots out of the cache.
        self.cache.demote(&unused);
        let evicted = self.cache.release_layer(Requester::Prefetch, layer);
        self.evict(&evicted);
        if self.prefetch_max_experts == 0 || experts.len() <= self.prefetch_max_experts as usize {
            if let Some(h) = self.history.get_mut(layer as usize) {
                h.clear();
                h.extend_from_slice(experts);
            }
        }
        let queue = std::mem::take(&mut self.queue);
        self.queue = queue
            .into_iter()
            .filter(|k| self.in_window(layer, k.layer))
            .collect();
        let n = self.n_layer();
        for d in 1..=self.prefetch_layers {
            let l = (layer + d) % n.max(1);
            for i in 0..self.history[l as usize].len() {
                let k = SlotKey {
                    layer: l,
                    expert: self.history[l as usize][i],
                };
                if !self.cache.contains(k) && !self.queue.contains(&k) {
                    self.queue.push_back(k);
                }
            }
        }
    }

    /// Read one chunk of queued prefetch work.
    fn prefetch_step(&mut self) {
        let mut keys = Vec::with_capacity(self.prefetch_chunk);
        while keys.len() < self.prefetch_chunk {
            let Some(k) = self.queue.pop_front() else {
                break;
            };
            if !self.cache.contains(k) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return;
        }
        let span = tracing::debug_span!("flash.prefetch", layer = keys[0].layer, n = keys.len());
        let _g = span.enter();
        let plan = self.cache.request_more(Requester::Prefetch, &keys);
        self.make_room(&plan.evict, &plan.misses);
        match self.read_misses(&plan.misses, &ALL_PROJ) {
            Ok(stats) => {
                self.count_idle_read(Requester::Prefetch, &stats);
                for k in &plan.misses {
                    let b = self.slot_bytes.get(k.layer as usize).copied().unwrap_or(0);
                    self.prefetched.insert(*k, b);
                }
            }
            Err(e) => {
                tracing::debug!("prefetch read failed (dropped, a demand will retry): {e}");
                self.counters
                    .prefetch_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Count a read done on idle time (prefetch or background) for `requester`.
    fn count_idle_read(&self, requester: Requester, stats: &ReadStats) {
        let c = &self.counters;
        c.read_bytes[requester.index()].fetch_add(stats.device_bytes, Ordering::Relaxed);
        c.io_ns
            .fetch_add(stats.elapsed.as_nanos() as u64, Ordering::Relaxed);
        c.resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
        c.peak_resident_bytes
            .fetch_max(self.cache.peak_resident_bytes(), Ordering::Relaxed);
    }

    /// Prefetched slots that leave the cache before their demand are wasted.
    fn note_evicted(&mut self, keys: &[SlotKey]) {
        if self.prefetched.is_empty() {
            return;
        }
        for k in keys {
            if let Some(b) = self.prefetched.remove(k) {
                self.counters
                    .prefetch_wasted_bytes
                    .fetch_add(b, Ordering::Relaxed);
            }
        }
    }

    fn evict(&mut self, keys: &[SlotKey]) {
        self.note_evicted(keys);
        // Keep the pages for the next misses; release what exceeds the cap.
        for k in keys {
            if !self.spares.contains(k) {
                self.spares.push_back(*k);
            }
        }
        while self.spares.len() > self.spare_cap {
            let k = self.spares.pop_front().expect("non-empty");
            for p in 0..N_PROJ as u8 {
                self.arena.release(k.layer, p, k.expert);
            }
        }
        self.counters
            .evictions
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.counters
            .resident_bytes
            .store(self.cache.resident_bytes(), Ordering::Relaxed);
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
        reply: &Sender<Result<DemandReply, String>>,
    ) -> Result<(), FlashError> {
        if let Some(w) = self.watch.as_mut() {
            w.check()?;
        }
        let limit = self.n_expert.get(layer as usize).copied().unwrap_or(0);
        if let Some(&bad) = experts.iter().find(|&&e| e >= limit) {
            return Err(FlashError::UnknownExpert { layer, expert: bad });
        }
        let mut dropped = Vec::new();
        let keys: Vec<SlotKey> = experts
            .iter()
            .map(|&expert| SlotKey { layer, expert })
            .filter(|k| {
                let drop = droppable.contains(&k.expert) && !self.cache.contains(*k);
                if drop {
                    dropped.push(k.expert);
                }
                !drop
            })
            .collect();
        self.counters
            .dropped_experts
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        // The requester's pass has begun: what it asked for in the background
        // and is still queued is read now if it needs it, else not at all.
        self.background.retain(|(r, _)| *r != requester);
        let plan = self.cache.request(requester, &keys);
        self.make_room(&plan.evict, &plan.misses);
        let phases: &[&[u8]] = if split {
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

    /// Give the evicted slots' pages to the misses (mremap: no faults, no
    /// zeroing) and release the rest, so RSS stays within the budget while reading.
    fn make_room(&mut self, evict: &[SlotKey], misses: &[SlotKey]) {
        // Each recycled slot can become its own memory mapping: past this many
        // resident slots, fall back to plain release to stay far below the
        // kernel's map count limit (65530 by default).
        let recycle = self.cache.resident_slots() < MAX_RECYCLED_SLOTS;
        let pairs = if recycle {
            evict.len().min(misses.len())
        } else {
            0
        };
        self.note_evicted(&evict[..pairs]);
        for (e, m) in evict.iter().zip(misses).take(pairs) {
            self.spares.retain(|s| s != e && s != m);
            self.move_pages(*e, *m);
        }
        self.counters
            .evictions
            .fetch_add(pairs as u64, Ordering::Relaxed);
        // Misses left without an evicted partner take kept pages.
        for m in &misses[pairs..] {
            if let Some(i) = self.spares.iter().position(|s| s == m) {
                // Its own old pages are still in place.
                self.spares.remove(i);
                continue;
            }
            if !recycle {
                continue;
            }
            if let Some(s) = self.spares.pop_back() {
                self.move_pages(s, *m);
            }
        }
        self.evict(&evict[pairs..]);
    }

    /// Move the pages of slot `from` (no longer cached) under slot `to` (a miss
    /// about to be read); a projection that cannot move is released instead.
    fn move_pages(&self, from: SlotKey, to: SlotKey) {
        for p in 0..N_PROJ as u8 {
            if !self
                .arena
                .move_slot(p, (from.layer, from.expert), (to.layer, to.expert))
            {
                self.arena.release(from.layer, p, from.expert);
            }
        }
    }

    /// Read the `projs` slices of every miss.
    fn read_misses(&mut self, misses: &[SlotKey], projs: &[u8]) -> Result<ReadStats, FlashError> {
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
        // SAFETY: every op targets a slot of a key that this plan just marked
        // resident (a miss): no matmul reads it until we reply, and no other op
        // in the batch overlaps it (distinct experts and projections).
        unsafe { self.reader.read_all(&self.ops) }.inspect_err(|_| {
            // Whatever was partially read must not be taken for resident.
            for k in misses {
                for p in 0..N_PROJ as u8 {
                    self.arena.release(k.layer, p, k.expert);
                }
            }
            self.cache.forget(misses);
        })
    }
}

#[cfg(test)]
mod ring_tests;
#[cfg(test)]
mod tests;
