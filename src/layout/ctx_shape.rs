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
    pub(crate) n_embd: u64,
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
        let kv_heads =
            per_layer(file.get(&key("attention.head_count_kv")), n_layer).unwrap_or(heads);
        let n_head = heads.max.max(1);
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
                let per_layer = (rank.max(0) as u64)
                    .saturating_mul(2)
                    .saturating_add(rope.max(0) as u64);
                n_layer.saturating_mul(per_layer)
            }
            None => kv_heads.sum.saturating_mul(k_len.saturating_add(v_len)),
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
            n_embd,
            n_ctx_train: file
                .get_int(&key("context_length"))
                .map(|v| v.max(0) as u64),
            nextn_share: (nextn.min(n_layer), n_layer.max(1)),
        })
    }
}

/// A per-layer count given as one number or an array, as its largest value
/// and its sum.
fn per_layer(v: Option<MetaValue>, n_layer: u64) -> Option<PerLayer> {
    // A header may say anything (the fuzz tests mutate it before the layout
    // check refuses it): nothing is allocated per layer, every sum saturates.
    match v? {
        MetaValue::Int(h) => {
            let h = h.max(0) as u64;
            Some(PerLayer {
                max: h,
                sum: h.saturating_mul(n_layer),
            })
        }
        MetaValue::IntArray(a) => {
            let each = a.iter().map(|&h| h.max(0) as u64);
            Some(PerLayer {
                max: each.clone().max().unwrap_or(0),
                sum: each.fold(0, u64::saturating_add),
            })
        }
        _ => None,
    }
}

/// A per-layer count's largest value and its sum over the layers.
#[derive(Debug, Clone, Copy)]
struct PerLayer {
    max: u64,
    sum: u64,
}

/// The vocabulary's size: the token embedding's rows.
fn vocab_size(file: &GgufFile) -> Option<u64> {
    let t = file.tensor("token_embd.weight")?;
    Some(t.ne[1].max(1))
}
