//! A resident run's observer for `--route-from`, and the overwrite of a
//! routing node's ids the verify hook shares with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::failure::HookError;
use super::names::TOPK_PREFIX;
use crate::llama::{BatchShape, EvalObserver, NodeView, ObserverFailure};
use crate::stream::route_from::RouteCursor;

/// The layer of a `ffn_moe_topk-L` node.
fn topk_layer(name: &str) -> Option<u32> {
    name.strip_prefix(TOPK_PREFIX)?.parse().ok()
}

/// Overwrite the routed ids of `node` (`ffn_moe_topk-L`, observe phase) with
/// the cursor's rows for its layer; `buf` is scratch.
pub(super) fn force_node(
    cursor: &RouteCursor,
    node: &NodeView<'_>,
    buf: &mut Vec<u16>,
) -> Result<(), HookError> {
    let name = node.name();
    let layer = topk_layer(name).ok_or_else(|| HookError::NotRouting {
        node: name.to_owned(),
    })?;
    let [k, rows, ..] = node.ne();
    if k.max(0) as usize != cursor.k() {
        return Err(HookError::RouteWidth {
            node: name.to_owned(),
            k,
            trace_k: cursor.k(),
        });
    }
    cursor
        .fill(layer, rows.max(0) as usize, buf)
        .map_err(|layer| HookError::Untraced { layer })?;
    for (i, &e) in buf.iter().enumerate() {
        let idx = [(i % cursor.k()) as u64, (i / cursor.k()) as u64, 0];
        // Observe phase of this very node: it is computed, and the nodes that
        // read it (the gating weights' get_rows, the expert matmuls) have not
        // run yet.
        // SAFETY: as the comment above says.
        if !unsafe { node.set_i32(idx, i32::from(e)) } {
            return Err(HookError::NodeWrite {
                node: name.to_owned(),
                what: "rewrite a routed id",
            });
        }
    }
    Ok(())
}
/// A resident run's observer for `--route-from`: it only forces the routing
/// (llama.cpp's mapping then pages in the experts the trace names).
pub(crate) struct ForcedRouting {
    cursor: RouteCursor,
    buf: Vec<u16>,
    failure: Option<Arc<HookError>>,
    abort: Arc<AtomicBool>,
}

impl ForcedRouting {
    pub(crate) fn new(cursor: RouteCursor, abort: Arc<AtomicBool>) -> Self {
        Self {
            cursor,
            buf: Vec::new(),
            failure: None,
            abort,
        }
    }
}

impl EvalObserver for ForcedRouting {
    fn wants(&mut self, node: &NodeView<'_>) -> bool {
        topk_layer(node.name()).is_some()
    }

    fn observe(&mut self, node: &NodeView<'_>) {
        if self.failure.is_some() {
            return;
        }
        if let Err(e) = force_node(&self.cursor, node, &mut self.buf) {
            tracing::error!("{e}");
            self.failure = Some(Arc::new(e));
            self.abort.store(true, Ordering::SeqCst);
        }
    }

    fn decode_begin(&mut self, batch: BatchShape) {
        self.cursor.decode_begin(batch.rows);
    }

    fn decode_end(&mut self) {
        self.cursor.decode_end();
    }

    fn failure(&self) -> Option<ObserverFailure> {
        self.failure.clone().map(|e| e as ObserverFailure)
    }
}

#[cfg(test)]
mod tests {
    use super::topk_layer;

    #[test]
    fn only_routing_nodes_have_a_layer() {
        assert_eq!(topk_layer("ffn_moe_topk-12"), Some(12));
        assert_eq!(topk_layer("ffn_moe_topk-x"), None);
        assert_eq!(topk_layer("ffn_moe_weights-3"), None);
    }
}
