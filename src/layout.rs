//! Where a model's expert bytes live: the MoE layout read from the gguf tensor
//! table (no weights loaded). Used by `inspect` and by the streaming engine.

use std::collections::BTreeMap;
use std::path::Path;

use crate::llama::gguf::{GgufFile, TensorInfo};
use crate::llama::quant::GgmlType;
use crate::llama::LlamaError;

/// The three projections of a SwiGLU expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];
    pub fn name(self) -> &'static str {
        match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }
}

/// One stacked expert tensor `blk.{layer}.ffn_{proj}_exps.weight` = [ne0, ne1, n_expert].
#[derive(Debug, Clone)]
pub struct ExpertTensor {
    pub layer: u32,
    pub proj: Proj,
    pub name: String,
    pub ggml_type: GgmlType,
    /// Absolute file offset of expert 0.
    pub file_offset: u64,
    /// Bytes of one expert (ne0 x ne1); expert e starts at file_offset + e * slice_bytes.
    pub slice_bytes: u64,
    pub n_expert: u32,
}

impl ExpertTensor {
    pub fn slice_offset(&self, expert: u32) -> u64 {
        self.file_offset + expert as u64 * self.slice_bytes
    }
}

/// The model seen as dense weights plus streamable expert slices.
#[derive(Debug, Clone)]
pub struct MoeLayout {
    pub arch: String,
    pub n_layer: u32,
    pub n_layer_nextn: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub experts: Vec<ExpertTensor>,
    pub total_tensor_bytes: u64,
    pub file_bytes: u64,
    pub alignment: u64,
    /// Tensor count and bytes per ggml type name.
    pub types: BTreeMap<String, (u32, u64)>,
}

fn parse_expert_name(name: &str) -> Option<(u32, Proj)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let proj = match tail {
        "ffn_gate_exps.weight" => Proj::Gate,
        "ffn_up_exps.weight" => Proj::Up,
        "ffn_down_exps.weight" => Proj::Down,
        _ => return None,
    };
    Some((layer, proj))
}

impl MoeLayout {
    pub fn from_file(g: &GgufFile) -> Self {
        let arch = g.arch().unwrap_or_else(|| "unknown".into());
        let block_count = g.arch_int("block_count").unwrap_or(0).max(0) as u32;
        let n_layer_nextn = g.arch_int("nextn_predict_layers").unwrap_or(0).max(0) as u32;
        let n_expert = g.arch_int("expert_count").unwrap_or(0).max(0) as u32;
        let n_expert_used = g.arch_int("expert_used_count").unwrap_or(0).max(0) as u32;
        let mut types: BTreeMap<String, (u32, u64)> = BTreeMap::new();
        let mut experts = Vec::new();
        let mut total = 0;
        for t in g.tensors() {
            total += t.size_bytes;
            let e = types.entry(t.ggml_type.name()).or_default();
            e.0 += 1;
            e.1 += t.size_bytes;
            if let Some((layer, proj)) = parse_expert_name(&t.name) {
                experts.push(expert_tensor(t, layer, proj));
            }
        }
        experts.sort_by_key(|e| (e.layer, e.proj));
        Self {
            arch,
            n_layer: block_count.saturating_sub(n_layer_nextn),
            n_layer_nextn,
            n_expert,
            n_expert_used,
            experts,
            total_tensor_bytes: total,
            file_bytes: g.file_bytes(),
            alignment: g.alignment(),
            types,
        }
    }

    pub fn open(path: &Path) -> Result<Self, LlamaError> {
        let g = GgufFile::open(path)?;
        g.check_complete()?;
        Ok(Self::from_file(&g))
    }

    pub fn is_moe(&self) -> bool {
        self.n_expert > 0 && !self.experts.is_empty()
    }

    pub fn expert_bytes(&self) -> u64 {
        self.experts
            .iter()
            .map(|e| e.slice_bytes * e.n_expert as u64)
            .sum()
    }

    pub fn dense_bytes(&self) -> u64 {
        self.total_tensor_bytes - self.expert_bytes()
    }

    /// Bytes of one expert slice per projection (from the first layer that has it).
    pub fn slice_bytes(&self, proj: Proj) -> Option<u64> {
        self.experts
            .iter()
            .find(|e| e.proj == proj)
            .map(|e| e.slice_bytes)
    }

    /// Bytes of one expert of `layer` (all projections).
    pub fn layer_expert_bytes(&self, layer: u32) -> u64 {
        self.experts
            .iter()
            .filter(|e| e.layer == layer)
            .map(|e| e.slice_bytes)
            .sum()
    }

    /// Routed expert bytes one token reads through the trunk (k experts per layer).
    pub fn routed_bytes_per_token(&self) -> u64 {
        (0..self.n_layer)
            .map(|l| self.layer_expert_bytes(l) * self.n_expert_used as u64)
            .sum()
    }

    /// Routed expert bytes of one pass through the nextn (MTP) blocks.
    pub fn routed_bytes_per_mtp_pass(&self) -> u64 {
        (self.n_layer..self.n_layer + self.n_layer_nextn)
            .map(|l| self.layer_expert_bytes(l) * self.n_expert_used as u64)
            .sum()
    }

    /// Layers whose experts are stacked in separate gate/up/down tensors.
    pub fn expert_layers(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.experts.iter().map(|e| e.layer).collect();
        v.dedup();
        v
    }
}

fn expert_tensor(t: &TensorInfo, layer: u32, proj: Proj) -> ExpertTensor {
    ExpertTensor {
        layer,
        proj,
        name: t.name.clone(),
        ggml_type: t.ggml_type,
        file_offset: t.file_offset,
        slice_bytes: t.slice_bytes(),
        n_expert: t.ne[2] as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(
            parse_expert_name("blk.7.ffn_up_exps.weight"),
            Some((7, Proj::Up))
        );
        assert_eq!(parse_expert_name("blk.7.ffn_up_shexp.weight"), None);
        assert_eq!(parse_expert_name("blk.x.ffn_up_exps.weight"), None);
    }
}
