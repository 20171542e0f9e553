//! Predictive prefetch: score layer L+1's router on layer L's MoE input, so
//! the experts it names can be read while layers L and L+1 still compute.
//!
//! Layer L's MoE input is `rmsnorm(h_L) * g_L` (g = `ffn_norm` weights). The
//! residual stream changes little from one layer to the next, so layer L+1's
//! input is approximated by `rmsnorm(h_L) * g_{L+1}` = `x_L * g_{L+1} / g_L`,
//! and its routing by the top-k of `W_{L+1} . that` (softmax keeps the order).
//! A guess only decides what is read early: the real routing is always served.

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::StreamError;
use crate::layout::MoeLayout;
use crate::llama::gguf::{GgufFile, GgufShards, TensorInfo};
use crate::llama::quant::dequantize;

/// One MoE layer's router: logits `w . x (+ bias)`; with a selection bias
/// (`exp_probs_b`) experts are picked by `sigmoid(logit) + probs_b`.
#[derive(Debug)]
struct Router {
    /// `n_expert` rows of `n_embd` weights.
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    probs_b: Option<Vec<f32>>,
}

/// Routers and norm ratios of every layer, dequantized to f32.
#[derive(Debug)]
pub(crate) struct Predictor {
    n_embd: usize,
    n_expert: usize,
    k: usize,
    /// Per layer: its router (None for a dense layer).
    router: Vec<Option<Router>>,
    /// Per layer L: g_{L+1} / g_L (0 where g_L is 0); empty where L or L+1
    /// has no router (nothing to guess from or for).
    ratio: Vec<Vec<f32>>,
}

fn read_f32(shards: &GgufShards, name: &str, want: usize) -> Result<Vec<f32>, StreamError> {
    let unsupported = |msg: String| {
        let path = shards.first().path().display();
        StreamError::PredictUnsupported(format!("{path}: {msg}"))
    };
    let (gguf, t) = shards
        .tensor(name)
        .ok_or_else(|| unsupported(format!("it has no tensor {name}")))?;
    let n: u64 = t.ne.iter().product();
    if n as usize != want {
        return Err(unsupported(format!(
            "{name} has {n} values, expected {want}"
        )));
    }
    read_values(gguf, t, n)
        .map_err(|e| StreamError::Predict(format!("{}: {e}", gguf.path().display())))
}

fn read_values(gguf: &GgufFile, t: &TensorInfo, n: u64) -> Result<Vec<f32>, String> {
    let name = &t.name;
    let mut buf = vec![0u8; t.size_bytes as usize];
    let f = std::fs::File::open(gguf.path()).map_err(|e| e.to_string())?;
    f.read_exact_at(&mut buf, t.file_offset)
        .map_err(|e| format!("read {name}: {e}"))?;
    dequantize(t.ggml_type, &buf, n).map_err(|e| e.to_string())
}

/// A layer's FFN pre-norm: `ffn_norm`, or `post_attention_norm` where a family
/// names it so (gpt-oss, glm4moe), or `attn_norm` where an MoE block has no
/// attention and that is its only norm (nemotron_h_moe).
fn ffn_norm(shards: &GgufShards, l: usize, n_embd: usize) -> Result<Vec<f32>, StreamError> {
    let name = ["ffn_norm", "post_attention_norm", "attn_norm"]
        .iter()
        .map(|n| format!("blk.{l}.{n}.weight"))
        .find(|n| shards.tensor(n).is_some())
        .unwrap_or_else(|| format!("blk.{l}.ffn_norm.weight"));
    read_f32(shards, &name, n_embd)
}

/// Layer `l`'s router, or None when it is dense (no `ffn_gate_inp`).
fn router(
    shards: &GgufShards,
    l: usize,
    n_embd: usize,
    n_expert: usize,
) -> Result<Option<Router>, StreamError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    if shards.tensor(&name("ffn_gate_inp.weight")).is_none() {
        return Ok(None);
    }
    let optional = |t: &str| -> Result<Option<Vec<f32>>, StreamError> {
        let n = name(t);
        shards
            .tensor(&n)
            .map(|_| read_f32(shards, &n, n_expert))
            .transpose()
    };
    Ok(Some(Router {
        w: read_f32(shards, &name("ffn_gate_inp.weight"), n_embd * n_expert)?,
        bias: optional("ffn_gate_inp.bias")?,
        probs_b: optional("exp_probs_b.bias")?,
    }))
}

impl Router {
    /// Expert `e`'s selection score for input `h` (softmax keeps the order of
    /// the logits, so they are compared as they are).
    fn score(&self, e: usize, n_embd: usize, h: &[f32]) -> f32 {
        let row = &self.w[e * n_embd..(e + 1) * n_embd];
        let mut s: f32 = row.iter().zip(h).map(|(a, b)| a * b).sum();
        if let Some(b) = &self.bias {
            s += b[e];
        }
        match &self.probs_b {
            Some(pb) => 1.0 / (1.0 + (-s).exp()) + pb[e],
            None => s,
        }
    }
}

impl Predictor {
    /// Load the routers (`ffn_gate_inp`, with their biases) and FFN norms of
    /// every MoE layer followed by another; routing `k` experts per token.
    pub(crate) fn load(path: &Path, layout: &MoeLayout, k: u32) -> Result<Self, StreamError> {
        let fail = |msg: String| StreamError::Predict(format!("{}: {msg}", path.display()));
        let shards = GgufShards::open(path).map_err(|e| fail(e.to_string()))?;
        let n_layer = layout.n_layer as usize;
        let n_expert = layout.n_expert as usize;
        let n_embd = shards
            .first()
            .arch_int("embedding_length")
            .ok_or_else(|| fail("no embedding_length".into()))? as usize;
        let router = (0..n_layer)
            .map(|l| router(&shards, l, n_embd, n_expert))
            .collect::<Result<Vec<_>, _>>()?;
        let pairs: Vec<usize> = (0..n_layer.saturating_sub(1))
            .filter(|&l| router[l].is_some() && router[l + 1].is_some())
            .collect();
        if pairs.is_empty() {
            return Err(StreamError::PredictUnsupported(format!(
                "{}: no MoE layer is followed by another (dense layers come between them)",
                layout.arch
            )));
        }
        let mut ratio = vec![Vec::new(); n_layer];
        for l in pairs {
            let (now, next) = (
                ffn_norm(&shards, l, n_embd)?,
                ffn_norm(&shards, l + 1, n_embd)?,
            );
            ratio[l] = now
                .iter()
                .zip(&next)
                .map(|(&a, &b)| if a != 0.0 { b / a } else { 0.0 })
                .collect();
        }
        Ok(Self {
            n_embd,
            n_expert,
            k: k.max(1) as usize,
            router,
            ratio,
        })
    }

    pub(crate) fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// Guess layer `layer + 1`'s experts from layer `layer`'s MoE input row `x`
    /// (length n_embd), best guess first. Returns false (and leaves `out` empty) when there is no
    /// next layer or the row has the wrong length.
    pub(crate) fn predict_next(&self, layer: u32, x: &[f32], out: &mut Vec<u32>) -> bool {
        out.clear();
        let l = layer as usize;
        let (Some(ratio), Some(Some(r))) = (self.ratio.get(l), self.router.get(l + 1)) else {
            return false;
        };
        if ratio.is_empty() || x.len() != self.n_embd {
            return false;
        }
        let h: Vec<f32> = x.iter().zip(ratio).map(|(a, r)| a * r).collect();
        let mut scores: Vec<(f32, u32)> = (0..self.n_expert)
            .map(|e| (r.score(e, self.n_embd, &h), e as u32))
            .collect();
        scores.sort_by(|a, b| b.0.total_cmp(&a.0));
        // Most confident first: that is the order the flash actor reads them in.
        out.extend(scores.iter().take(self.k).map(|&(_, e)| e));
        true
    }
}
