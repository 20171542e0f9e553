//! What a gguf header says about one context's memory: the K and V
//! elements a token adds, the vocabulary and heads the compute buffers scale
//! with, the training context and the share of the layers a draft (MTP)
//! context holds. Read once with the layout; `engine::ctx_check` turns it
//! into bytes and a verdict.

use crate::llama::gguf::{GgufFile, MetaValue};

/// The shape of one context's memory, read from the header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CtxShape {
    /// K and V elements one token adds to the cache, all layers together.
    pub(crate) kv_elements_per_token: u64,
    pub(crate) n_vocab: u64,
    pub(crate) n_head: u64,
    /// `{arch}.context_length` (None: the file does not say).
    pub(crate) n_ctx_train: Option<u64>,
    /// The share of the KV a draft (MTP) context holds: its nextn layers of
    /// all the layers.
    pub(crate) nextn_share: (u64, u64),
}

impl CtxShape {
    /// Read from a model's headers (the first file's metadata, the token
    /// embedding from whichever shard holds it; None where they lack what is
    /// needed).
    pub(crate) fn of(files: &[GgufFile]) -> Option<Self> {
        let file = files.first()?;
        let arch = file.arch()?;
        let key = |s: &str| format!("{arch}.{s}");
        let n_layer = file.get_int(&key("block_count"))?.max(0) as u64;
        let n_embd = file.get_int(&key("embedding_length"))?.max(1) as u64;
        let heads = per_layer(file.get(&key("attention.head_count")), n_layer)?;
        let kv_heads = per_layer(file.get(&key("attention.head_count_kv")), n_layer)
            .unwrap_or_else(|| heads.clone());
        let n_head = heads.iter().copied().max().unwrap_or(1).max(1);
        let head_dim = n_embd / n_head;
        let k_len = file
            .get_int(&key("attention.key_length"))
            .map_or(head_dim, |v| v as u64);
        let v_len = file
            .get_int(&key("attention.value_length"))
            .map_or(head_dim, |v| v as u64);
        let kv_elements_per_token = match file.get_int(&key("attention.kv_lora_rank")) {
            // MLA caches the compressed latent and the rope part per layer.
            Some(rank) => {
                let rope = file.get_int(&key("rope.dimension_count")).unwrap_or(64);
                n_layer * (2 * rank.max(0) as u64 + rope.max(0) as u64)
            }
            None => kv_heads.iter().map(|&h| h * (k_len + v_len)).sum(),
        };
        let n_vocab = files.iter().find_map(vocab_size)?;
        let nextn = file
            .get_int(&key("nextn_predict_layers"))
            .unwrap_or(0)
            .max(0) as u64;
        Some(Self {
            kv_elements_per_token,
            n_vocab,
            n_head,
            n_ctx_train: file
                .get_int(&key("context_length"))
                .map(|v| v.max(0) as u64),
            nextn_share: (nextn.min(n_layer), n_layer.max(1)),
        })
    }
}

/// A per-layer count given as one number or an array.
fn per_layer(v: Option<MetaValue>, n_layer: u64) -> Option<Vec<u64>> {
    match v? {
        MetaValue::Int(h) => Some(vec![h.max(0) as u64; n_layer as usize]),
        MetaValue::IntArray(a) => Some(a.iter().map(|&h| h.max(0) as u64).collect()),
        _ => None,
    }
}

/// The vocabulary's size: the token embedding's rows.
fn vocab_size(file: &GgufFile) -> Option<u64> {
    let t = file.tensor("token_embd.weight")?;
    Some(t.ne[1].max(1))
}
