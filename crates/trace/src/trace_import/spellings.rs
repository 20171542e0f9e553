//! The field names each kind of value goes by in the wild, in the order
//! they are tried.

/// A route's expert ids.
pub const IDS: [&str; 4] = ["experts", "expert_ids", "topk_ids", "selected_experts"];
/// A route's router weights.
pub const WEIGHTS: [&str; 5] = [
    "weights",
    "gating_probs",
    "topk_weights",
    "router_weights",
    "probs",
];
/// The token's index or position.
pub const TOKEN: [&str; 5] = ["token_idx", "token_pos", "token", "position", "pos"];
/// The layer's index.
pub const LAYER: [&str; 3] = ["layer", "layer_idx", "layer_id"];
