//! The verify-side eval hook: at `ffn_moe_topk-L` it reads the routed ids of
//! every row of the batch, asks the flash actor for their union and blocks until
//! they are resident (the stall); at each expert matmul of layer L it points the
//! weight tensor at the engine's arena, so no expert byte is read from
//! llama.cpp's mapping.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bmoe_actors::cache::Requester;
use bmoe_actors::flash::{AnonBuffer, Arena, FlashClient, FlashCounters};

use super::memory;
use super::predict::Predictor;
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
    /// [`StreamHook::with_route_log`]: the MTP head's hook, whose drafting pass
    /// predicts its catch-up pass).
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

const TOPK_PREFIX: &str = "ffn_moe_topk-";
const WEIGHTS_PREFIX: &str = "ffn_moe_weights-";
const LOGITS_PREFIX: &str = "ffn_moe_logits-";
const PROBS_PREFIX: &str = "ffn_moe_probs-";

/// Breadth-first search up a node's sources (a few levels) for a node whose
/// name starts with `prefix`: from `ffn_moe_topk-L` this finds the router's
/// logits and probabilities of the same layer, still alive at that point
/// because later nodes of the layer read them.
fn find_src<'a>(node: &NodeView<'a>, prefix: &str, depth: usize) -> Option<NodeView<'a>> {
    let mut frontier: Vec<NodeView<'a>> =
        (0..llama_max_src()).filter_map(|i| node.src(i)).collect();
    for _ in 0..depth {
        if let Some(i) = frontier.iter().position(|n| n.name().starts_with(prefix)) {
            return Some(frontier.swap_remove(i));
        }
        frontier = frontier
            .iter()
            .flat_map(|n| {
                (0..llama_max_src())
                    .filter_map(|i| n.src(i))
                    .collect::<Vec<_>>()
            })
            .collect();
        if frontier.is_empty() {
            return None;
        }
    }
    None
}
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

/// The anonymous copy of dense weight `src` (made now if it is new), or None
/// when `src` is not in llama.cpp's file mapping. The store's lock is never held
/// across the copy, which faults the tensor in from disk.
fn anon_copy(shared: &SharedAnon, src: &NodeView<'_>) -> Result<Option<*mut u8>, String> {
    let addr = src.data_addr();
    let len = src.nbytes() as usize;
    // A poisoned lock means a hook panicked while holding it: the store only
    // ever holds whole copies, so keep going.
    let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
    {
        let anon = lock();
        if let Some(c) = anon.copies.get(&addr) {
            return Ok(Some(c.as_ptr()));
        }
        if !anon.inside(addr, len) {
            return Ok(None);
        }
    }
    // SAFETY: [addr, addr + len) lies inside llama.cpp's readable file mapping
    // (checked above; the mapping lives as long as the model) and holds this
    // tensor's bytes.
    let copy = unsafe { AnonBuffer::copy_from(addr as *const u8, len) };
    let copy = copy.map_err(|e| e.to_string())?;
    let mut anon = lock();
    if let Some(c) = anon.copies.get(&addr) {
        // Copied meanwhile by the other context's hook: use that one.
        return Ok(Some(c.as_ptr()));
    }
    let ptr = copy.as_ptr();
    tracing::trace!(
        tensor = src.name(),
        bytes = len,
        "dense weight copied to anonymous memory"
    );
    anon.copied_bytes += len as u64;
    anon.copies.insert(addr, copy);
    drop(anon);
    memory::drop_pages(addr, len);
    Ok(Some(ptr))
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
    /// `--dense-weights anon`: llama.cpp's mapping (address range) and the copies
    /// made, shared with the MTP draft context's hook (rebinding a weight is seen
    /// by every context of the model, so both must use one set of copies).
    anon: Option<SharedAnon>,
    /// `--overlap`: wait for gate/up at the routing, for down at the activation.
    overlap: bool,
    /// The graph segment computing now (from the last callback to the next), as
    /// a `verify.segment` span, so a trace shows compute between the waits.
    segment: Option<tracing::span::EnteredSpan>,
    segments: u32,
    /// Experts routed per token (after `--n-expert-used`).
    k: usize,
    /// Shared flash counters (prefetch bytes are attributed per decode).
    counters: Option<Arc<FlashCounters>>,
    prefetch_bytes_seen: u64,
    /// `--predict-prefetch`: the routers, and the guesses not yet judged.
    predictor: Option<Arc<Predictor>>,
    predicted: HashMap<u32, Vec<u32>>,
    row: Vec<f32>,
    /// `--drop-cold-experts F` (0: off).
    drop_frac: f32,
    /// Positions (in the routed list of the single row) whose weight must be
    /// zeroed at `ffn_moe_weights-L` because their expert was dropped.
    drop_zero: Vec<u64>,
    drop_layer: Option<u32>,
    /// Record every demand in the stats (`StepStats::routed`).
    route_log: bool,
}

/// [`DenseAnon`] shared by the hooks of every context on the model (the verify
/// context and the MTP draft context, which may run on another thread).
pub type SharedAnon = Arc<Mutex<DenseAnon>>;

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
            k: layout.n_expert_used.max(1) as usize,
            counters: None,
            prefetch_bytes_seen: 0,
            predictor: None,
            predicted: HashMap::new(),
            row: Vec::new(),
            drop_frac: 0.0,
            drop_zero: Vec::new(),
            drop_layer: None,
            route_log: false,
        }
    }

    /// Experts routed per token when `--n-expert-used` overrides the model's.
    pub fn with_k(mut self, k: u32) -> Self {
        self.k = k.max(1) as usize;
        self
    }

    /// Attribute the flash actor's read-ahead bytes to the decodes.
    pub fn with_counters(mut self, counters: Arc<FlashCounters>) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Guess the next layer's routing and ask the flash actor to read it early.
    pub fn with_predictor(mut self, p: Option<Arc<Predictor>>) -> Self {
        self.predictor = p;
        self
    }

    /// Skip cold (missing, low-weight) routed experts (lossy; 0 is off).
    pub fn with_drop_cold(mut self, frac: f32) -> Self {
        self.drop_frac = frac.max(0.0);
        self
    }

    /// Log every demand's routing in the stats (`StepStats::routed`).
    pub fn with_route_log(mut self) -> Self {
        self.route_log = true;
        self
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
    pub fn with_dense_anon(mut self, anon: SharedAnon) -> Self {
        self.anon = Some(anon);
        self
    }

    /// Point every dense weight a node reads from the file mapping at an
    /// anonymous copy (made on first sight; the mapping's pages are then dropped).
    fn bind_dense(&mut self, node: &NodeView<'_>) {
        let Some(shared) = self.anon.clone() else {
            return;
        };
        for i in 0..llama_max_src() {
            let Some(src) = node.src(i) else { continue };
            // Only model weights still served from the file mapping (never
            // activations or caches, never the streamed experts).
            if !src.is_weight() || self.weights.contains_key(src.name()) {
                continue;
            }
            match anon_copy(&shared, &src) {
                Ok(None) => {}
                Ok(Some(copy)) => {
                    // SAFETY: the copy holds the tensor's exact bytes (nbytes) and
                    // lives in the shared store, which every hook on the model holds
                    // (and each context owns its hook), so it outlives every decode
                    // of every context; no other decode of the model runs (the
                    // decode turn).
                    unsafe { src.rebind_data(copy) }
                }
                Err(e) => {
                    self.fail(format!("--dense-weights anon: {e}"));
                    return;
                }
            }
        }
    }

    /// Record the first error (later ones are its consequences: logged at
    /// debug) and abort the decode.
    fn fail(&mut self, msg: String) {
        let mut s = self.stats.borrow_mut();
        if s.error.is_none() {
            tracing::error!("{msg}");
            s.error = Some(msg);
        } else {
            tracing::debug!("after the first error: {msg}");
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
        // One token's routing (a single-row decode): what prediction and the
        // lossy drop work on. Prompt batches are always served whole.
        let single = self.ids.len() == self.k;
        if single {
            if let Some(guess) = self.predicted.remove(&layer) {
                let used = guess.iter().filter(|e| self.union.contains(e)).count();
                let mut s = self.stats.borrow_mut();
                s.predicted += guess.len() as u64;
                s.predicted_used += used as u64;
            }
        }
        let droppable = if single && self.drop_frac > 0.0 {
            self.cold_candidates(node)
        } else {
            Vec::new()
        };
        let hint = if single {
            self.predict_next(node, layer)
        } else {
            None
        };
        let span = tracing::debug_span!("hook.wait", layer, experts = self.union.len());
        let _g = span.enter();
        let t0 = Instant::now();
        let res = self.client.demand_with(
            layer,
            &self.union,
            &droppable,
            self.overlap,
            hint.as_ref().map(|g| (layer + 1, g.as_slice())),
        );
        drop(_g);
        if let Some(g) = hint {
            self.predicted.insert(layer + 1, g);
        }
        match res {
            Ok(r) => {
                if !r.dropped.is_empty() && !self.apply_drop(node, layer, &r.dropped) {
                    return;
                }
                let mut s = self.stats.borrow_mut();
                s.stall += t0.elapsed();
                s.io += r.io_time;
                s.read_bytes += r.read_bytes;
                s.hits += r.hits as u64;
                s.misses += r.misses as u64;
                s.evictions += r.evictions as u64;
                s.demands += 1;
                if self.route_log {
                    s.routed.push((layer, self.union.clone()));
                }
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
            || (!self.drop_zero.is_empty()
                && name
                    .strip_prefix(WEIGHTS_PREFIX)
                    .and_then(|l| l.parse().ok())
                    == self.drop_layer)
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        self.segment = None;
        let name = node.name();
        if name.starts_with(TOPK_PREFIX) {
            self.serve(node);
        } else if name.starts_with(WEIGHTS_PREFIX) {
            self.zero_dropped_weights(node);
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
        if let Some(c) = &self.counters {
            let total = c.read_bytes[Requester::Prefetch.index()].load(Ordering::Relaxed);
            let delta = total.saturating_sub(self.prefetch_bytes_seen);
            self.prefetch_bytes_seen = total;
            let mut s = self.stats.borrow_mut();
            s.prefetch_bytes += delta;
            s.read_bytes += delta;
        }
    }
}

impl StreamHook {
    /// The routed experts of the single row whose normalized router weight is
    /// below `drop_frac / k` (the flash actor drops them only if they are misses).
    fn cold_candidates(&mut self, node: &NodeView<'_>) -> Vec<u32> {
        let Some(probs) = find_src(node, PROBS_PREFIX, 6) else {
            return Vec::new();
        };
        if !probs.copy_f32_2d(&mut self.row) {
            return Vec::new();
        }
        let p = |e: i32| self.row.get(e as usize).copied().unwrap_or(0.0);
        let sum: f32 = self.ids.iter().map(|&e| p(e)).sum();
        if sum <= 0.0 {
            return Vec::new();
        }
        let threshold = self.drop_frac / self.k as f32;
        let top = self
            .ids
            .iter()
            .copied()
            .max_by(|a, b| p(*a).total_cmp(&p(*b)));
        self.ids
            .iter()
            .copied()
            .filter(|&e| Some(e) != top && p(e) / sum < threshold)
            .map(|e| e as u32)
            .collect()
    }

    /// Route the dropped experts' positions to the row's strongest expert and
    /// remember to zero their weights at `ffn_moe_weights-L` (the weight
    /// normalization then renormalizes over the experts kept).
    fn apply_drop(&mut self, node: &NodeView<'_>, layer: u32, dropped: &[u32]) -> bool {
        let Some(probs) = find_src(node, PROBS_PREFIX, 6) else {
            self.fail(format!(
                "layer {layer}: router probabilities not found for the drop"
            ));
            return false;
        };
        if !probs.copy_f32_2d(&mut self.row) {
            self.fail(format!("layer {layer}: router probabilities unreadable"));
            return false;
        }
        let p = |e: i32| self.row.get(e as usize).copied().unwrap_or(0.0);
        let Some(top) = self
            .ids
            .iter()
            .copied()
            .max_by(|a, b| p(*a).total_cmp(&p(*b)))
        else {
            return true;
        };
        self.drop_zero.clear();
        for (i, &e) in self.ids.iter().enumerate() {
            if e >= 0 && dropped.contains(&(e as u32)) {
                // SAFETY: observe phase of this very node: it is computed and the
                // nodes that read it (weights, expert matmuls) have not run yet.
                if !unsafe { node.set_i32([i as u64, 0, 0], top) } {
                    self.fail(format!("{}: cannot rewrite a routed id", node.name()));
                    return false;
                }
                self.drop_zero.push(i as u64);
            }
        }
        self.drop_layer = Some(layer);
        self.stats.borrow_mut().dropped += self.drop_zero.len() as u64;
        true
    }

    /// Zero the dropped positions' weights (observe phase of `ffn_moe_weights-L`).
    fn zero_dropped_weights(&mut self, node: &NodeView<'_>) {
        for &i in &self.drop_zero {
            // SAFETY: observe phase of this node: computed, not yet read by the
            // normalization that follows it.
            if !unsafe { node.set_f32([0, i, 0], 0.0) } {
                let name = node.name().to_owned();
                self.fail(format!("{name}: cannot zero a dropped expert's weight"));
                return;
            }
        }
        self.drop_zero.clear();
        self.drop_layer = None;
    }

    /// Guess layer L+1's experts from layer L's MoE input (best first).
    fn predict_next(&mut self, node: &NodeView<'_>, layer: u32) -> Option<Vec<u32>> {
        let p = self.predictor.clone()?;
        let input = find_src(node, LOGITS_PREFIX, 6).and_then(|l| l.src(1))?;
        if !input.copy_f32_2d(&mut self.row) || self.row.len() != p.n_embd() {
            return None;
        }
        let mut guess = Vec::with_capacity(self.k);
        p.predict_next(layer, &self.row, &mut guess)
            .then_some(guess)
    }

    fn open_segment(&mut self, after: &str) {
        self.segments += 1;
        self.segment = Some(
            tracing::debug_span!("verify.segment", n = self.segments, after = after).entered(),
        );
    }
}
