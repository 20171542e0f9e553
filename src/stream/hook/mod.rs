//! The verify-side eval hook: at `ffn_moe_topk-L` it reads the routed ids of
//! every row of the batch, asks the flash actor for their union and blocks until
//! they are resident (the stall); at each expert matmul of layer L it points the
//! weight tensor at the engine's arena, so no expert byte is read from
//! llama.cpp's mapping.

mod anon;
mod dense;
mod failure;
mod force;
mod forced;
mod names;
mod router;
mod serve;

pub(crate) use anon::{DenseAnon, SharedAnon};
pub(crate) use forced::ForcedRouting;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bmoe_decode::metrics::DecodeMetrics;
use bmoe_flash::cache::Requester;
use bmoe_flash::{Arena, FlashClient, FlashCounters};

use self::failure::HookError;
use self::names::{activation_layer, node_layer, TOPK_PREFIX, WEIGHTS_PREFIX};
use super::predict::Predictor;
use crate::layout::{MoeLayout, Proj};
use crate::llama::{BatchShape, EvalObserver, NodeView, ObserverFailure};

/// What a hook does besides serving the routed experts (the verify hook
/// sets most; the MTP head's hook only `k`, `route_log` and `anon`).
#[derive(Default)]
pub(crate) struct HookOptions {
    /// Experts routed per token (after `--n-expert-used`).
    pub(crate) k: u32,
    /// `--overlap`: wait for gate/up at the routing, for down at the activation.
    pub(crate) overlap: bool,
    /// Shared flash counters, to attribute read-ahead bytes to the decodes.
    pub(crate) counters: Option<Arc<FlashCounters>>,
    /// `--predict-prefetch`: guess the next layer's routing and read it early.
    pub(crate) predictor: Option<Arc<Predictor>>,
    /// `--drop-cold-experts F`: skip cold, low-weight routed experts (lossy; 0 is off).
    pub(crate) drop_cold: f32,
    /// Log every demand's routing in the metrics ([`DecodeMetrics::routed`]).
    pub(crate) route_log: bool,
    /// `--dense-weights anon`: llama.cpp's mapping (address range) and the
    /// copies made, shared with the MTP draft context's hook (rebinding a
    /// weight is seen by every context of the model, so both use one set).
    pub(crate) anon: Option<SharedAnon>,
    /// `--route-trace`: every demand's routed ids and every decode's rows.
    pub(crate) route_trace: Option<super::trace::RouteTraceWriter>,
    /// `--rpc`: the first block on an RPC host; from there on every node is
    /// left alone (its tensors live in the host's memory).
    pub(crate) remote_from: Option<u32>,
    /// Answer a demand whose experts are all resident without the round trip
    /// to the flash actor (`FlashClient::try_hits`); not with prediction or
    /// drops, whose hints and replies need the actor.
    pub(crate) fast_hits: bool,
    /// `--route-from`: every row's routed ids replaced by the trace's.
    pub(crate) force: Option<super::route_from::RouteCursor>,
}

pub(crate) struct StreamHook {
    client: FlashClient,
    arena: Arc<Arena>,
    /// The model's facts the callbacks read, fixed for the hook's life.
    model: HookModel,
    /// The demand being served: its layer, ids and scratch.
    demand: Demand,
    /// The decode running now.
    decode: DecodeState,
    /// What the decodes since the last [`EvalObserver::take_metrics`] cost.
    metrics: DecodeMetrics,
    /// The first error met inside a callback (the decode was aborted for it).
    failure: Option<Arc<HookError>>,
    abort: Arc<AtomicBool>,
    opts: HookOptions,
    prefetch_bytes_seen: u64,
    /// `--predict-prefetch`: the guesses not yet judged.
    predicted: HashMap<u32, Vec<u32>>,
    /// `--drop-cold-experts`: the routed positions to zero.
    dropped: Dropped,
}

/// The model as the hook sees it.
struct HookModel {
    /// Expert weight tensor name -> (layer, projection index).
    weights: HashMap<String, (u32, Proj)>,
    n_expert: u32,
    /// Experts routed per token (`opts.k`, at least 1).
    k: usize,
    /// The router's "probabilities" are its logits, softmaxed over the picked
    /// experts only (gpt-oss): how `--drop-cold-experts` weighs them.
    logit_router: bool,
    /// Bytes of one expert of each layer (all projections), and the trunk's
    /// layer count (the layers a prompt batch runs through in order).
    expert_bytes: Vec<u64>,
    n_layer: u32,
}

/// The routing demand of one layer and its scratch buffers.
#[derive(Default)]
struct Demand {
    /// The layer whose experts were made resident most recently.
    current: Option<u32>,
    ids: Vec<i32>,
    union: Vec<u32>,
    /// A row of the router's probabilities, or the layer's input (prediction).
    row: Vec<f32>,
    /// `--route-from`'s scratch: the forced ids of a demand.
    forced: Vec<u16>,
}

/// The decode running now.
#[derive(Default)]
struct DecodeState {
    /// Its batch, and its widest demand's rows (0 before its first demand).
    batch: BatchShape,
    rows: u32,
    /// The (layer, expert) slices batches demanded since the last
    /// single-token decode (a prompt's distinct routed slices).
    seen: HashSet<(u32, u32)>,
    /// The graph segment computing now (from the last callback to the next), as
    /// a `verify.segment` span, so a trace shows compute between the waits.
    segment: Option<tracing::span::EnteredSpan>,
    segments: u32,
}

/// Positions (in the routed list of the single row) whose weight must be
/// zeroed at `ffn_moe_weights-L` because their expert was dropped, and the
/// layer they belong to.
#[derive(Default)]
struct Dropped {
    zero: Vec<u64>,
    layer: Option<u32>,
}

impl StreamHook {
    pub(crate) fn new(
        client: FlashClient,
        arena: Arc<Arena>,
        layout: &MoeLayout,
        opts: HookOptions,
        abort: Arc<AtomicBool>,
    ) -> Self {
        let weights = layout
            .experts
            .iter()
            .map(|e| (e.name.clone(), (e.layer, e.proj)))
            .collect();
        let k = if opts.k > 0 {
            opts.k
        } else {
            layout.n_expert_used
        };
        let model = HookModel {
            weights,
            n_expert: layout.n_expert,
            k: k.max(1) as usize,
            logit_router: layout.arch == "gpt-oss",
            expert_bytes: (0..layout.n_layer + layout.n_layer_nextn)
                .map(|l| layout.layer_expert_bytes(l))
                .collect(),
            n_layer: layout.n_layer,
        };
        Self {
            client,
            arena,
            model,
            demand: Demand::default(),
            decode: DecodeState::default(),
            metrics: DecodeMetrics::default(),
            failure: None,
            abort,
            opts,
            prefetch_bytes_seen: 0,
            predicted: HashMap::new(),
            dropped: Dropped::default(),
        }
    }

    /// Whether `layer` runs on this host (every layer does without `--rpc`).
    fn is_local(&self, layer: u32) -> bool {
        self.opts.remote_from.is_none_or(|first| layer < first)
    }

    /// Whether the node named `name` runs on this host: only `--rpc` parses
    /// the name (a node outside the layers is local).
    fn node_is_local(&self, name: &str) -> bool {
        self.opts.remote_from.is_none() || node_layer(name).is_none_or(|l| self.is_local(l))
    }

    /// Record the first error (later ones are its consequences: logged at
    /// debug) and abort the decode.
    fn fail(&mut self, e: HookError) {
        if self.failure.is_none() {
            tracing::error!("{e}");
            self.failure = Some(Arc::new(e));
        } else {
            tracing::debug!("after the first error: {e}");
        }
        self.abort.store(true, Ordering::SeqCst);
    }
}

impl EvalObserver for StreamHook {
    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        if !self.node_is_local(node.name()) {
            return false;
        }
        if self.opts.anon.is_some() {
            self.bind_dense(node);
        }
        if node.is_mul_mat_id() {
            self.bind(node);
            return false;
        }
        let name = node.name();
        name.starts_with(TOPK_PREFIX)
            || (self.opts.overlap && self.client.down_pending() && activation_layer(name).is_some())
            || (!self.dropped.zero.is_empty()
                && name
                    .strip_prefix(WEIGHTS_PREFIX)
                    .and_then(|l| l.parse().ok())
                    == self.dropped.layer)
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        self.decode.segment = None;
        let name = node.name();
        if name.starts_with(TOPK_PREFIX) {
            if self.force_routing(node) {
                self.serve(node);
            }
        } else if name.starts_with(WEIGHTS_PREFIX) {
            self.zero_dropped_weights(node);
        } else if activation_layer(name).is_some() {
            self.wait_down();
        }
        self.open_segment(name);
    }

    fn decode_begin(&mut self, batch: BatchShape) {
        self.decode.batch = batch;
        if let Some(c) = self.opts.force.as_mut() {
            c.decode_begin(batch.rows);
        }
        self.decode.segments = 0;
        self.open_segment("decode start");
    }

    fn decode_end(&mut self) {
        self.decode.segment = None;
        // The last layer's matmuls have run: its fast-path pins go.
        self.client.end_pass();
        self.trace_decode_end();
        if let Some(c) = self.opts.force.as_mut() {
            c.decode_end();
        }
        if let Some(c) = &self.opts.counters {
            let total = c.read_bytes[Requester::Prefetch.index()].load(Ordering::Relaxed);
            let delta = total.saturating_sub(self.prefetch_bytes_seen);
            self.prefetch_bytes_seen = total;
            self.metrics.prefetch_bytes += delta;
            self.metrics.read_bytes += delta;
        }
    }

    fn take_metrics(&mut self) -> DecodeMetrics {
        std::mem::take(&mut self.metrics)
    }

    fn failure(&self) -> Option<ObserverFailure> {
        self.failure.clone().map(|e| e as ObserverFailure)
    }
}

impl StreamHook {
    /// `--route-trace`: the routed ids of every row of the demand just served.
    fn trace_demand(&mut self, layer: u32) {
        self.decode.rows = self
            .decode
            .rows
            .max((self.demand.ids.len() / self.model.k) as u32);
        // A prompt's micro-batch without the row that wants logits keeps no
        // row through the last layer: a demand of nothing, which the format
        // has no record for (a reader refuses 0 ids).
        let Some(w) = self
            .opts
            .route_trace
            .as_mut()
            .filter(|_| !self.demand.ids.is_empty())
        else {
            return;
        };
        if let Err(e) = w.demand(layer, self.demand.ids.iter().map(|&e| e as u32)) {
            self.fail(HookError::RouteTrace(e));
        }
    }

    /// `--route-trace`: the decode's end (and a flush), after its demands.
    fn trace_decode_end(&mut self) {
        let rows = std::mem::take(&mut self.decode.rows);
        let Some(w) = self.opts.route_trace.as_mut().filter(|_| rows > 0) else {
            return;
        };
        // The batch's own count of rows with logits: a family whose graph
        // keeps every row through the last layer (gpt-oss) would otherwise
        // look like a verify, and its prompt count as generation.
        let outputs = self.decode.batch.outputs.min(rows);
        if let Err(e) = w.decode_end(rows, outputs) {
            self.fail(HookError::RouteTrace(e));
        }
    }

    fn open_segment(&mut self, after: &str) {
        self.decode.segments += 1;
        self.decode.segment = Some(
            tracing::debug_span!("verify.segment", n = self.decode.segments, after = after)
                .entered(),
        );
    }
}
