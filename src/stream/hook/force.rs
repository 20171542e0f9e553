//! `--route-from`: the routed ids of every row overwritten with the trace's,
//! at `ffn_moe_topk-L` once it is computed, before the gating weights
//! (`ggml_get_rows(probs, selected_experts)`) and the expert matmuls read
//! them. The verify hook does it before serving a layer; a resident run has
//! [`super::forced::ForcedRouting`] as its observer for it alone.

use super::forced::force_node;
use super::StreamHook;
use crate::llama::NodeView;

impl StreamHook {
    /// `--route-from`: the trace's ids in place of the router's, before
    /// [`StreamHook::serve`] reads them; false when that failed (the
    /// decode is aborted).
    pub(super) fn force_routing(&mut self, node: &NodeView<'_>) -> bool {
        let Some(cursor) = self.opts.force.as_ref() else {
            return true;
        };
        let mut buf = std::mem::take(&mut self.demand.forced);
        let res = force_node(cursor, node, &mut buf);
        self.demand.forced = buf;
        match res {
            Ok(()) => true,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }
}
