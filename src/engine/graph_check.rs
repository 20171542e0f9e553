//! Whether llama.cpp can build the compute graph of a model routed with more
//! experts per token than the file says (`--n-expert-used`).
//!
//! llama.cpp sizes its graph arena from the model's tensor count, not from
//! the number of experts routed: past some K, building the graph fails an
//! assertion and aborts the process. The limit depends on the architecture and
//! llama.cpp's version, so it is not computed here but tried: in a child
//! process (`bmoe check-graph`), which can abort without taking the run along.

use std::path::Path;
use std::sync::Arc;

use super::prefill::TARGET_UBATCH;
use crate::layout::MoeLayout;
use crate::llama::{Context, ContextParams, LlamaError, Model, ModelParams};

/// Load `model` routed with `k` experts per token and build its target
/// context (llama.cpp reserves the worst-case graph there). Aborts the process
/// when llama.cpp cannot hold the graph: run it in a child.
pub fn build_graph(model: &Path, k: u32, n_ctx: u32) -> Result<(), LlamaError> {
    let layout = MoeLayout::open(model)?;
    let m = Arc::new(Model::load(
        model,
        &ModelParams {
            use_mmap: true,
            load_mtp: false,
            int_overrides: vec![(format!("{}.expert_used_count", layout.arch), i64::from(k))],
            ..ModelParams::default()
        },
    )?);
    Context::new(
        m,
        ContextParams {
            n_ctx,
            n_batch: TARGET_UBATCH,
            n_ubatch: TARGET_UBATCH,
            n_threads: 1,
            ..ContextParams::default()
        },
    )?;
    Ok(())
}
