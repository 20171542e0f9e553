//! The verify-side eval hook: at `ffn_moe_topk-L` it reads the routed ids of
//! every row of the batch, asks the flash actor for their union and blocks until
//! they are resident (the stall); at each expert matmul of layer L it points the
//! weight tensor at the engine's arena, so no expert byte is read from
//! llama.cpp's mapping.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bmoe_actors::flash::{AnonBuffer, Arena, FlashClient};

use super::memory;
use crate::layout::{MoeLayout, Proj};
use crate::llama::{llama_max_src, EvalObserver, NodeView};

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
    /// First error met inside a callback (the decode was aborted because of it).
    pub error: Option<String>,
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

const TOPK_PREFIX: &str = "ffn_moe_topk-";
/// The activation between the gate/up and the down expert matmuls, by the names
/// llama.cpp's build_moe_ffn gives it: in overlap mode the down slices are
/// awaited there, after the gate/up matmuls have run.
const ACTIVATIONS: [&str; 10] = [
    "ffn_moe_swiglu-",
    "ffn_moe_silu-",
    "ffn_moe_geglu-",
    "ffn_moe_gelu-",
    "ffn_moe_reglu-",
    "ffn_moe_relu-",
    "ffn_moe_situ-",
    "ffn_moe_swiglu_oai-",
    "ffn_moe_swiglu_limited-",
    "ffn_moe_relu_sqr-",
];

fn activation_layer(name: &str) -> Option<u32> {
    ACTIVATIONS
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .and_then(|l| l.parse().ok())
}

pub struct StreamHook {
    client: FlashClient,
    arena: Arc<Arena>,
    /// Expert weight tensor name -> (layer, projection index).
    weights: HashMap<String, (u32, u8)>,
    n_expert: u32,
    /// The layer whose experts were made resident most recently.
    current: Option<u32>,
    ids: Vec<i32>,
    union: Vec<u32>,
    stats: SharedStats,
    abort: Arc<AtomicBool>,
    /// `--dense-weights anon`: llama.cpp's mapping (address range) and the copies made.
    anon: Option<DenseAnon>,
    /// `--overlap`: wait for gate/up at the routing, for down at the activation.
    overlap: bool,
    /// The graph segment computing now (from the last callback to the next), as
    /// a `verify.segment` span, so a trace shows compute between the waits.
    segment: Option<tracing::span::EnteredSpan>,
    segments: u32,
}

/// Dense weights moved out of the file mapping into anonymous memory, tensor by
/// tensor, the first time a node reads them.
pub struct DenseAnon {
    /// Address ranges of llama.cpp's file mapping (only its mapped intervals: the
    /// holes it unmapped may hold other allocations later).
    mapped: Vec<(usize, usize)>,
    copies: HashMap<usize, AnonBuffer>,
    pub copied_bytes: u64,
}

impl DenseAnon {
    pub fn new(mapped: Vec<(usize, usize)>) -> Self {
        Self {
            mapped,
            copies: HashMap::new(),
            copied_bytes: 0,
        }
    }

    fn inside(&self, addr: usize, len: usize) -> bool {
        self.mapped
            .iter()
            .any(|&(a, b)| addr >= a && addr + len <= b)
    }
}

impl StreamHook {
    pub fn new(
        client: FlashClient,
        arena: Arc<Arena>,
        layout: &MoeLayout,
        stats: SharedStats,
        abort: Arc<AtomicBool>,
    ) -> Self {
        let weights = layout
            .experts
            .iter()
            .map(|e| (e.name.clone(), (e.layer, proj_index(e.proj))))
            .collect();
        Self {
            client,
            arena,
            weights,
            n_expert: layout.n_expert,
            current: None,
            ids: Vec::new(),
            union: Vec::new(),
            stats,
            abort,
            anon: None,
            overlap: false,
            segment: None,
            segments: 0,
        }
    }

    /// Overlap the down reads with the gate/up matmuls (`--overlap`).
    pub fn with_overlap(mut self, overlap: bool) -> Self {
        self.overlap = overlap;
        self
    }

    /// Wait for the down slices of the current layer (overlap mode), counting the stall.
    fn wait_down(&mut self) {
        if !self.client.down_pending() {
            return;
        }
        let layer = self.current;
        let span = tracing::debug_span!("hook.wait_down", layer = layer.unwrap_or(u32::MAX));
        let _g = span.enter();
        let t0 = Instant::now();
        match self.client.wait_down() {
            Ok(r) => {
                let mut s = self.stats.borrow_mut();
                s.stall += t0.elapsed();
                s.io += r.io_time;
                s.read_bytes += r.read_bytes;
            }
            Err(e) => {
                self.current = None;
                self.fail(format!("expert down read for layer {layer:?} failed: {e}"));
            }
        }
    }

    /// Serve dense weights from anonymous copies (`--dense-weights anon`).
    pub fn with_dense_anon(mut self, anon: DenseAnon) -> Self {
        self.anon = Some(anon);
        self
    }

    /// Point every dense weight a node reads from the file mapping at an
    /// anonymous copy (made on first sight; the mapping's pages are then dropped).
    fn bind_dense(&mut self, node: &NodeView<'_>) {
        let Some(anon) = self.anon.as_mut() else {
            return;
        };
        let mut failure = None;
        for i in 0..llama_max_src() {
            let Some(src) = node.src(i) else { continue };
            // Only model weights still served from the file mapping (never
            // activations or caches, never the streamed experts).
            if !src.is_weight() || self.weights.contains_key(src.name()) {
                continue;
            }
            let addr = src.data_addr();
            let len = src.nbytes() as usize;
            if !anon.copies.contains_key(&addr) && !anon.inside(addr, len) {
                continue;
            }
            if !anon.copies.contains_key(&addr) {
                // SAFETY: [addr, addr + len) lies inside llama.cpp's readable file
                // mapping (checked above) and holds this tensor's bytes.
                match unsafe { AnonBuffer::copy_from(addr as *const u8, len) } {
                    Ok(b) => {
                        tracing::trace!(
                            tensor = src.name(),
                            bytes = len,
                            node = node.name(),
                            "dense weight copied to anonymous memory"
                        );
                        anon.copied_bytes += len as u64;
                        memory::drop_pages(addr, len);
                        anon.copies.insert(addr, b);
                    }
                    Err(e) => {
                        failure = Some(format!("--dense-weights anon: {e}"));
                        break;
                    }
                }
            }
            let copy = &anon.copies[&addr];
            // SAFETY: the copy holds the tensor's exact bytes (nbytes) and lives in
            // the hook, which the context owns, so it outlives every decode.
            unsafe { src.rebind_data(copy.as_ptr()) };
        }
        if let Some(msg) = failure {
            self.fail(msg);
        }
    }

    fn fail(&mut self, msg: String) {
        tracing::error!("{msg}");
        let mut s = self.stats.borrow_mut();
        if s.error.is_none() {
            s.error = Some(msg);
        }
        self.abort.store(true, Ordering::SeqCst);
    }

    /// Rebind an expert matmul's weights to the arena (ask phase, before it runs).
    fn bind(&mut self, node: &NodeView<'_>) {
        let Some(w) = node.src(0) else { return };
        let Some(&(layer, proj)) = self.weights.get(w.name()) else {
            return;
        };
        if proj == 2 {
            // Normally already awaited at the activation; this covers archs whose
            // activation node bmoe does not know.
            self.wait_down();
        }
        if self.current != Some(layer) {
            self.fail(format!(
                "expert matmul {} of layer {layer} ran without its routing being served \
                 (last served layer {:?}); stopping rather than computing with missing weights",
                node.name(),
                self.current
            ));
            return;
        }
        let Some(base) = self.arena.base(layer, proj) else {
            self.fail(format!("no arena region for {}", w.name()));
            return;
        };
        if self.arena.region_len(layer, proj) < w.nbytes() {
            self.fail(format!(
                "arena region for {} is smaller than the tensor",
                w.name()
            ));
            return;
        }
        // The routed experts of `layer` (checked above to be the layer just served)
        // were read into the region and stay pinned until the next demand, which can
        // only come after this layer's matmuls have run.
        // SAFETY: the region is >= nbytes, laid out like the tensor (expert e at
        // e * slice bytes), pinned as above, and the arena outlives the context.
        unsafe { w.rebind_data(base) };
    }

    /// Routing of layer L is known: make its experts resident (blocking).
    fn serve(&mut self, node: &NodeView<'_>) {
        let Ok(layer) = node.name()[TOPK_PREFIX.len()..].parse::<u32>() else {
            return;
        };
        if !node.copy_i32_2d(&mut self.ids) {
            self.fail(format!("{} is not a readable I32 tensor", node.name()));
            return;
        }
        self.union.clear();
        for &id in &self.ids {
            if id < 0 || id as u32 >= self.n_expert {
                self.fail(format!("{}: expert id {id} out of range", node.name()));
                return;
            }
            self.union.push(id as u32);
        }
        self.union.sort_unstable();
        self.union.dedup();
        let span = tracing::debug_span!("hook.wait", layer, experts = self.union.len());
        let _g = span.enter();
        let t0 = Instant::now();
        let res = if self.overlap {
            self.client.demand_gate_up(layer, &self.union)
        } else {
            self.client.demand(layer, &self.union)
        };
        match res {
            Ok(r) => {
                let mut s = self.stats.borrow_mut();
                s.stall += t0.elapsed();
                s.io += r.io_time;
                s.read_bytes += r.read_bytes;
                s.hits += r.hits as u64;
                s.misses += r.misses as u64;
                s.evictions += r.evictions as u64;
                s.demands += 1;
                drop(s);
                self.current = Some(layer);
            }
            Err(e) => {
                self.current = None;
                self.fail(format!("expert read for layer {layer} failed: {e}"));
            }
        }
    }
}

fn proj_index(p: Proj) -> u8 {
    match p {
        Proj::Gate => 0,
        Proj::Up => 1,
        Proj::Down => 2,
    }
}

impl EvalObserver for StreamHook {
    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        if self.anon.is_some() {
            self.bind_dense(node);
        }
        if node.is_mul_mat_id() {
            self.bind(node);
            return false;
        }
        let name = node.name();
        name.starts_with(TOPK_PREFIX)
            || (self.overlap && self.client.down_pending() && activation_layer(name).is_some())
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        self.segment = None;
        let name = node.name();
        if name.starts_with(TOPK_PREFIX) {
            self.serve(node);
        } else if activation_layer(name).is_some() {
            self.wait_down();
        }
        self.open_segment(name);
    }

    fn decode_begin(&mut self) {
        self.segments = 0;
        self.open_segment("decode start");
    }

    fn decode_end(&mut self) {
        self.segment = None;
    }
}

impl StreamHook {
    fn open_segment(&mut self, after: &str) {
        self.segments += 1;
        self.segment = Some(
            tracing::debug_span!("verify.segment", n = self.segments, after = after).entered(),
        );
    }
}
