//! The flash actor: owns the reader (io_uring) and the expert cache, serves
//! demand requests ("layer L needs experts {..}, reply when resident"), evicts
//! under the byte budget, and counts bytes, hits and misses per requester.

mod arena;
mod io;
mod probe;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

pub use arena::{AnonBuffer, Arena, TensorSpec, N_PROJ};
pub use io::{open_reader, PreadReader, ReadOp, ReadStats, SliceReader, UringReader};
pub use probe::{probe_read_bandwidth, ProbeResult};

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
    #[error("flash configuration: {0}")]
    Config(String),
    #[error("the flash actor has stopped: {0}")]
    Stopped(String),
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
}

impl Default for FlashConfig {
    fn default() -> Self {
        Self {
            budget_bytes: 0,
            queue_depth: 4,
            o_direct: true,
            request_capacity: 16,
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
        /// Reply twice: once gate/up are resident, once down is (overlap mode).
        split: bool,
        reply: Sender<Result<DemandReply, String>>,
    },
    Release(Requester),
}

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
    reply_tx: Sender<Result<DemandReply, String>>,
    reply_rx: Receiver<Result<DemandReply, String>>,
    requester: Requester,
    /// A split demand whose down slices have not been waited for yet.
    down_pending: bool,
}

impl FlashClient {
    fn send(&self, layer: u32, experts: &[u32], split: bool) -> Result<(), FlashError> {
        self.tx
            .send(Msg::Demand {
                requester: self.requester,
                layer,
                experts: experts.to_vec(),
                split,
                reply: self.reply_tx.clone(),
            })
            .map_err(|_| FlashError::Stopped("request channel closed".into()))
    }

    fn recv(&self) -> Result<DemandReply, FlashError> {
        self.reply_rx
            .recv()
            .map_err(|_| FlashError::Stopped("no reply".into()))?
            .map_err(FlashError::Stopped)
    }

    /// Block until `experts` of `layer` are resident (and pinned for this requester).
    pub fn demand(&mut self, layer: u32, experts: &[u32]) -> Result<DemandReply, FlashError> {
        self.wait_down()?;
        self.send(layer, experts, false)?;
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
        self.send(layer, experts, true)?;
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
        Self::spawn_with_reader(reader, notes, specs, cfg)
    }

    /// As [`Flash::spawn`] with a given reader (fault injection in tests).
    pub fn spawn_with_reader(
        reader: Box<dyn SliceReader>,
        notes: Vec<String>,
        specs: Vec<TensorSpec>,
        cfg: FlashConfig,
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
            cache: ExpertCache::new(cfg.budget_bytes, slot_bytes),
            n_expert,
            arena: arena.clone(),
            reader,
            counters: counters.clone(),
            ops: Vec::new(),
        };
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
        let (reply_tx, reply_rx) = bounded(2);
        FlashClient {
            tx: self.tx.clone().expect("flash running"),
            reply_tx,
            reply_rx,
            requester,
            down_pending: false,
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
    arena: Arc<Arena>,
    reader: Box<dyn SliceReader>,
    counters: Arc<FlashCounters>,
    ops: Vec<ReadOp>,
}

impl Actor {
    fn run(&mut self, rx: Receiver<Msg>) {
        while let Ok(msg) = rx.recv() {
            match msg {
                Msg::Demand {
                    requester,
                    layer,
                    experts,
                    split,
                    reply,
                } => {
                    let span =
                        tracing::debug_span!("flash.demand", layer, n = experts.len(), split);
                    let _g = span.enter();
                    if let Err(e) = self.demand(requester, layer, &experts, split, &reply) {
                        let _ = reply.send(Err(e.to_string()));
                    }
                }
                Msg::Release(r) => {
                    let evicted = self.cache.release(r);
                    self.evict(&evicted);
                }
            }
        }
    }

    fn evict(&mut self, keys: &[SlotKey]) {
        for k in keys {
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
        split: bool,
        reply: &Sender<Result<DemandReply, String>>,
    ) -> Result<(), FlashError> {
        let limit = self.n_expert.get(layer as usize).copied().unwrap_or(0);
        if let Some(&bad) = experts.iter().find(|&&e| e >= limit) {
            return Err(FlashError::UnknownExpert { layer, expert: bad });
        }
        let keys: Vec<SlotKey> = experts
            .iter()
            .map(|&expert| SlotKey { layer, expert })
            .collect();
        let plan = self.cache.request(requester, &keys);
        self.make_room(&plan.evict, &plan.misses);
        let phases: &[&[u8]] = if split {
            &[&GATE_UP, &[DOWN]]
        } else {
            &[&ALL_PROJ]
        };
        for (i, projs) in phases.iter().enumerate() {
            let stats = self.read_misses(layer, &plan.misses, projs)?;
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
                hits: counted(plan.hits.len()),
                misses: counted(plan.misses.len()),
                evictions: counted(plan.evict.len()),
                read_bytes: stats.device_bytes,
                io_time: stats.elapsed,
            }));
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
        for (e, m) in evict.iter().zip(misses).take(pairs) {
            for p in 0..N_PROJ as u8 {
                if !self
                    .arena
                    .move_slot(p, (e.layer, e.expert), (m.layer, m.expert))
                {
                    self.arena.release(e.layer, p, e.expert);
                }
            }
        }
        self.counters
            .evictions
            .fetch_add(pairs as u64, Ordering::Relaxed);
        self.evict(&evict[pairs..]);
    }

    /// Read the `projs` slices of every miss.
    fn read_misses(
        &mut self,
        layer: u32,
        misses: &[SlotKey],
        projs: &[u8],
    ) -> Result<ReadStats, FlashError> {
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
mod tests;
