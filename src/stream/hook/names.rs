//! The names llama.cpp's build_moe_ffn gives the nodes the hook watches,
//! and the layer each one belongs to.

pub(super) const TOPK_PREFIX: &str = "ffn_moe_topk-";
pub(super) const WEIGHTS_PREFIX: &str = "ffn_moe_weights-";
pub(super) const LOGITS_PREFIX: &str = "ffn_moe_logits-";
pub(super) const PROBS_PREFIX: &str = "ffn_moe_probs-";

/// The activation between the gate/up and the down expert matmuls, by the names
/// llama.cpp's build_moe_ffn gives it: in overlap mode the down slices are
/// awaited there, after the gate/up matmuls have run.
pub(super) const ACTIVATIONS: [&str; 10] = [
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

pub(super) fn activation_layer(name: &str) -> Option<u32> {
    ACTIVATIONS
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .and_then(|l| l.parse().ok())
}

/// The block of a node named `NAME-N` (llama.cpp's per-layer names).
pub(super) fn node_layer(name: &str) -> Option<u32> {
    name.rsplit_once('-')?.1.parse().ok()
}
