//! The verify-side eval hook: at `ffn_moe_topk-L` it reads the routed ids of
//! every row of the batch, asks the flash actor for their union and blocks until
//! they are resident (the stall); at each expert matmul of layer L it points the
//! weight tensor at the engine's arena, so no expert byte is read from
//! llama.cpp's mapping.

mod dense;
mod router;
mod serve;
mod stats;

pub use dense::{DenseAnon, SharedAnon};
pub use stats::{SharedStats, StepStats};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bmoe_actors::cache::Requester;
use bmoe_actors::flash::{Arena, FlashClient, FlashCounters};

use super::predict::Predictor;
use crate::layout::{MoeLayout, Proj};
use crate::llama::{EvalObserver, NodeView};

const TOPK_PREFIX: &str = "ffn_moe_topk-";
const WEIGHTS_PREFIX: &str = "ffn_moe_weights-";
const LOGITS_PREFIX: &str = "ffn_moe_logits-";
const PROBS_PREFIX: &str = "ffn_moe_probs-";

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
    weights: HashMap<String, (u32, Proj)>,
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
            .map(|e| (e.name.clone(), (e.layer, e.proj)))
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

    /// Serve dense weights from anonymous copies (`--dense-weights anon`).
    pub fn with_dense_anon(mut self, anon: SharedAnon) -> Self {
        self.anon = Some(anon);
        self
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
    fn open_segment(&mut self, after: &str) {
        self.segments += 1;
        self.segment = Some(
            tracing::debug_span!("verify.segment", n = self.segments, after = after).entered(),
        );
    }
}
