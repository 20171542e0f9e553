//! `--dense-weights anon`: the hook's rebinding of a node's dense sources to
//! their anonymous copies ([`super::anon`]).

use super::anon::anon_copy;
use super::failure::HookError;
use super::StreamHook;
use crate::llama::{llama_max_src, NodeView};

impl StreamHook {
    /// Point every dense weight a node reads from the file mapping at an
    /// anonymous copy (made on first sight; the mapping's pages are then dropped).
    pub(super) fn bind_dense(&mut self, node: &NodeView<'_>) {
        let Some(shared) = self.opts.anon.clone() else {
            return;
        };
        for i in 0..llama_max_src() {
            let Some(src) = node.src(i) else { continue };
            // Only model weights still served from the file mapping (never
            // activations or caches, never the streamed experts).
            if !src.is_weight() || self.model.weights.contains_key(src.name()) {
                continue;
            }
            match anon_copy(&shared, &src) {
                Ok(None) => {}
                Ok(Some(copy)) => {
                    // The copy holds the tensor's exact bytes (nbytes) and lives in
                    // the shared store, which every hook on the model holds (and each
                    // context owns its hook), so it outlives every decode of every context.
                    // SAFETY: as above; no other decode of the model runs (decode turn).
                    unsafe { src.rebind_data(copy) }
                }
                Err(e) => {
                    self.fail(HookError::DenseAnon(e));
                    return;
                }
            }
        }
    }
}
