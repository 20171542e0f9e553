//! The hook's use of a layer's router outputs on a single-row decode: the
//! lossy drop of cold experts (`--drop-cold-experts`) and the guess of the next
//! layer's experts (`--predict-prefetch`).

use super::failure::HookError;
use super::names::{LOGITS_PREFIX, PROBS_PREFIX};
use super::StreamHook;
use crate::llama::{llama_max_src, NodeView};

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

/// The weights the routed experts get from their router outputs `picked`:
/// probabilities (softmax, sigmoid, softplus) normalised to sum 1; `logits`
/// (gpt-oss softmaxes the picked logits) through a softmax. None when they
/// carry no weight.
fn selected_weights(picked: &[f32], logits: bool) -> Option<Vec<f32>> {
    if picked.iter().any(|v| !v.is_finite()) || picked.is_empty() {
        return None;
    }
    let w: Vec<f32> = if logits {
        let max = picked.iter().copied().fold(f32::MIN, f32::max);
        picked.iter().map(|&v| (v - max).exp()).collect()
    } else {
        picked.to_vec()
    };
    let sum: f32 = w.iter().sum();
    (sum > 0.0).then(|| w.iter().map(|v| v / sum).collect())
}

impl StreamHook {
    /// The routed experts of the single row whose normalized router weight is
    /// below `drop_frac / k` (the flash actor drops them only if they are misses).
    pub(super) fn cold_candidates(&mut self, node: &NodeView<'_>) -> Vec<u32> {
        let Some(probs) = find_src(node, PROBS_PREFIX, 10) else {
            return Vec::new();
        };
        if !probs.copy_f32_2d(&mut self.demand.row) {
            return Vec::new();
        }
        let p = |e: i32| self.demand.row.get(e as usize).copied().unwrap_or(0.0);
        let picked: Vec<f32> = self.demand.ids.iter().map(|&e| p(e)).collect();
        let Some(w) = selected_weights(&picked, self.model.logit_router) else {
            return Vec::new();
        };
        let threshold = self.opts.drop_cold / self.model.k as f32;
        let top = (0..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b]));
        self.demand
            .ids
            .iter()
            .enumerate()
            .filter(|&(i, _)| Some(i) != top && w[i] < threshold)
            .map(|(_, &e)| e as u32)
            .collect()
    }

    /// Route the dropped experts' positions to the row's strongest expert and
    /// remember to zero their weights at `ffn_moe_weights-L` (the weight
    /// normalization then renormalizes over the experts kept).
    pub(super) fn apply_drop(&mut self, node: &NodeView<'_>, layer: u32, dropped: &[u32]) -> bool {
        let Some(probs) = find_src(node, PROBS_PREFIX, 10) else {
            self.fail(HookError::RouterProbs {
                layer,
                what: "not found for the drop",
            });
            return false;
        };
        if !probs.copy_f32_2d(&mut self.demand.row) {
            self.fail(HookError::RouterProbs {
                layer,
                what: "unreadable",
            });
            return false;
        }
        let p = |e: i32| self.demand.row.get(e as usize).copied().unwrap_or(0.0);
        let Some(top) = self
            .demand
            .ids
            .iter()
            .copied()
            .max_by(|a, b| p(*a).total_cmp(&p(*b)))
        else {
            return true;
        };
        self.dropped.zero.clear();
        for (i, &e) in self.demand.ids.iter().enumerate() {
            if e >= 0 && dropped.contains(&(e as u32)) {
                // Observe phase of this very node: it is computed and the
                // nodes that read it (weights, expert matmuls) have not run yet.
                // SAFETY: as the comment above says.
                if !unsafe { node.set_i32([i as u64, 0, 0], top) } {
                    self.fail(HookError::NodeWrite {
                        node: node.name().to_owned(),
                        what: "rewrite a routed id",
                    });
                    return false;
                }
                self.dropped.zero.push(i as u64);
            }
        }
        self.dropped.layer = Some(layer);
        self.metrics.dropped += self.dropped.zero.len() as u64;
        true
    }

    /// Zero the dropped positions' weights (observe phase of `ffn_moe_weights-L`).
    pub(super) fn zero_dropped_weights(&mut self, node: &NodeView<'_>) {
        for &i in &self.dropped.zero {
            // Observe phase of this node: computed, not yet read by the
            // normalization that follows it.
            // SAFETY: as the comment above says.
            if !unsafe { node.set_f32([0, i, 0], 0.0) } {
                let name = node.name().to_owned();
                self.fail(HookError::NodeWrite {
                    node: name,
                    what: "zero a dropped expert's weight",
                });
                return;
            }
        }
        self.dropped.zero.clear();
        self.dropped.layer = None;
    }

    /// Guess layer L+1's experts from layer L's MoE input (best first).
    pub(super) fn predict_next(&mut self, node: &NodeView<'_>, layer: u32) -> Option<Vec<u32>> {
        let p = self.opts.predictor.clone()?;
        let input = find_src(node, LOGITS_PREFIX, 10).and_then(|l| l.src(1))?;
        if !input.copy_f32_2d(&mut self.demand.row) || self.demand.row.len() != p.n_embd() {
            return None;
        }
        let mut guess = Vec::with_capacity(self.model.k);
        p.predict_next(layer, &self.demand.row, &mut guess)
            .then_some(guess)
    }
}

#[cfg(test)]
mod tests {
    use super::selected_weights;

    #[test]
    fn probabilities_are_normalised_and_logits_softmaxed() {
        assert_eq!(selected_weights(&[0.3, 0.1], false), Some(vec![0.75, 0.25]));
        let w = selected_weights(&[2.0, -1.0], true).unwrap();
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6 && w[0] > 0.9, "{w:?}");
        let w = selected_weights(&[1.0, 1.0], true).unwrap();
        assert_eq!(w, vec![0.5, 0.5]);
        assert_eq!(selected_weights(&[0.0, 0.0], false), None);
        assert_eq!(selected_weights(&[f32::NAN, 1.0], false), None);
    }
}
