//! The hook's per-layer serving: at `ffn_moe_topk-L` demand the routed
//! experts' union from the flash actor (blocking), at each expert matmul point
//! its weights at the arena, and in overlap mode wait for the down slices.

use std::time::Instant;

use bmoe_flash::cache::reads_whole_layer;
use bmoe_flash::DemandReply;

use super::failure::HookError;
use super::names::TOPK_PREFIX;
use super::StreamHook;
use crate::layout::Proj;
use crate::llama::NodeView;

impl StreamHook {
    /// Count the bytes of the slices this batch demands for the first time
    /// since the last single-token decode (which starts a new count).
    fn note_slices(&mut self, layer: u32, single: bool) {
        if single {
            // Per layer of every token: only a table that holds something is cleared.
            if !self.decode.seen.is_empty() {
                self.decode.seen.clear();
            }
            return;
        }
        let bytes = self
            .model
            .expert_bytes
            .get(layer as usize)
            .copied()
            .unwrap_or(0);
        for &e in &self.demand.union {
            if self.decode.seen.insert((layer, e)) {
                self.metrics.first_seen_bytes += bytes;
            }
        }
    }

    /// A wide batch (a prompt's micro-batch) routes to nearly every expert
    /// of every layer: read the next trunk layer whole while this one computes.
    fn whole_next_layer(&self, layer: u32) -> Option<Vec<u32>> {
        let next = layer + 1;
        let has_experts = self
            .model
            .expert_bytes
            .get(next as usize)
            .is_some_and(|&b| b > 0);
        (next < self.model.n_layer
            && has_experts
            && reads_whole_layer(self.demand.ids.len(), self.model.n_expert))
        .then(|| (0..self.model.n_expert).collect())
    }

    /// Wait for the down slices of the current layer (overlap mode), counting the stall.
    pub(super) fn wait_down(&mut self) {
        if !self.client.down_pending() {
            return;
        }
        let layer = self.demand.current;
        let span = tracing::debug_span!("hook.wait_down", layer = layer.unwrap_or(u32::MAX));
        let _g = span.enter();
        let t0 = Instant::now();
        match self.client.wait_down() {
            Ok(r) => {
                let s = &mut self.metrics;
                s.stall += t0.elapsed();
                s.io += r.io_time;
                s.read_bytes += r.read_bytes;
            }
            Err(e) => {
                self.demand.current = None;
                self.fail(HookError::DownRead { layer, source: e });
            }
        }
    }

    /// Rebind an expert matmul's weights to the arena (ask phase, before it runs).
    pub(super) fn bind(&mut self, node: &NodeView<'_>) {
        let Some(w) = node.src(0) else { return };
        let Some(&(layer, proj)) = self.model.weights.get(w.name()) else {
            return;
        };
        if proj == Proj::Down {
            // Normally already awaited at the activation; this covers archs whose
            // activation node bmoe does not know.
            self.wait_down();
        }
        if self.demand.current != Some(layer) {
            self.fail(HookError::Unserved {
                node: node.name().to_owned(),
                layer,
                last: self.demand.current,
            });
            return;
        }
        let Some(base) = self.arena.base(layer, proj) else {
            self.fail(HookError::NoRegion {
                tensor: w.name().to_owned(),
            });
            return;
        };
        if self.arena.region_len(layer, proj) < w.nbytes() {
            self.fail(HookError::RegionTooSmall {
                tensor: w.name().to_owned(),
            });
            return;
        }
        // The routed experts of `layer` (checked above to be the layer just served)
        // were read into the region and stay pinned until the next demand, which can
        // only come after this layer's matmuls have run.
        // The region is >= nbytes, laid out like the tensor (expert e at
        // e * slice bytes), pinned as above, and the arena outlives the context.
        // SAFETY: as the comment above says.
        unsafe { w.rebind_data(base) };
    }

    /// Routing of layer L is known: make its experts resident (blocking).
    pub(super) fn serve(&mut self, node: &NodeView<'_>) {
        let Ok(layer) = node.name()[TOPK_PREFIX.len()..].parse::<u32>() else {
            return;
        };
        if !node.copy_i32_2d(&mut self.demand.ids) {
            self.fail(HookError::Ids {
                node: node.name().to_owned(),
            });
            return;
        }
        self.demand.union.clear();
        for &id in &self.demand.ids {
            if id < 0 || id as u32 >= self.model.n_expert {
                self.fail(HookError::IdOutOfRange {
                    node: node.name().to_owned(),
                    id,
                });
                return;
            }
            self.demand.union.push(id as u32);
        }
        self.demand.union.sort_unstable();
        self.demand.union.dedup();
        // One token's routing (a single-row decode): what prediction and the
        // lossy drop work on. Prompt batches are always served whole.
        let single = self.demand.ids.len() == self.model.k;
        if single {
            if let Some(guess) = self.predicted.remove(&layer) {
                let used = guess
                    .iter()
                    .filter(|e| self.demand.union.contains(e))
                    .count();
                self.metrics
                    .predicted
                    .add(layer, guess.len() as u64, used as u64);
            }
        }
        let droppable = if single && self.opts.drop_cold > 0.0 {
            self.cold_candidates(node)
        } else {
            Vec::new()
        };
        self.note_slices(layer, single);
        let hint = match single {
            true => self.predict_next(node, layer),
            false => self.whole_next_layer(layer),
        }
        .filter(|_| self.is_local(layer + 1));
        if self.opts.fast_hits && droppable.is_empty() && hint.is_none() {
            let span = tracing::debug_span!("hook.fast", layer, experts = self.demand.union.len());
            let _g = span.enter();
            let t0 = Instant::now();
            if let Some(r) = self.client.try_hits(layer, &self.demand.union) {
                drop(_g);
                self.served(node, layer, r, t0);
                return;
            }
        }
        let span = tracing::debug_span!("hook.wait", layer, experts = self.demand.union.len());
        let _g = span.enter();
        let t0 = Instant::now();
        let res = self.client.demand_with(
            layer,
            &self.demand.union,
            &droppable,
            self.opts.overlap,
            hint.as_ref().map(|g| (layer + 1, g.as_slice())),
        );
        drop(_g);
        // Only a single row's guess is judged as a prediction.
        if let Some(g) = hint.filter(|_| single) {
            self.predicted.insert(layer + 1, g);
        }
        match res {
            Ok(r) => self.served(node, layer, r, t0),
            Err(e) => {
                self.demand.current = None;
                self.fail(HookError::ExpertRead { layer, source: e });
            }
        }
    }

    /// Layer `layer`'s experts are resident (`r`, waited for since `t0`):
    /// apply its drops, count it, and let its matmuls bind.
    fn served(&mut self, node: &NodeView<'_>, layer: u32, r: DemandReply, t0: Instant) {
        if !r.dropped.is_empty() && !self.apply_drop(node, layer, &r.dropped) {
            return;
        }
        let s = &mut self.metrics;
        s.stall += t0.elapsed();
        s.io += r.io_time;
        s.read_bytes += r.read_bytes;
        s.hits += r.hits as u64;
        s.misses += r.misses as u64;
        s.evictions += r.evictions as u64;
        s.demands += 1;
        if self.opts.route_log {
            s.routed.push((layer, self.demand.union.clone()));
        }
        self.demand.current = Some(layer);
        self.trace_demand(layer);
    }
}
