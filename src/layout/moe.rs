//! The MoE layout read from the gguf tensor table: each block's expert
//! tensors, their bytes and where in the file they lie.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ctx_shape::CtxShape;
use super::remote_share::RemoteShare;
use crate::llama::gguf::{GgufFile, GgufShards, TensorInfo};
use crate::llama::quant::GgmlType;
use crate::llama::LlamaError;

/// The three projections of a SwiGLU expert (one type with the flash arena's).
pub use bmoe_flash::proj::Proj;

/// One stacked expert tensor `blk.{layer}.ffn_{proj}_exps.weight` = [ne0, ne1, n_expert].
#[derive(Debug, Clone)]
pub struct ExpertTensor {
    pub(crate) layer: u32,
    pub(crate) proj: Proj,
    pub name: String,
    pub ggml_type: GgmlType,
    /// The file (index into [`MoeLayout::shards`]) that holds it.
    pub shard: usize,
    /// Offset of expert 0 in its shard's file.
    pub file_offset: u64,
    /// Offset of expert 0 in the streaming address space (its shard's base +
    /// `file_offset`): what the flash actor reads.
    pub(crate) stream_offset: u64,
    /// Bytes of one expert (ne0 x ne1); expert e starts at file_offset + e * slice_bytes.
    pub slice_bytes: u64,
    pub n_expert: u32,
}

impl ExpertTensor {
    pub fn slice_offset(&self, expert: u32) -> u64 {
        self.file_offset + expert as u64 * self.slice_bytes
    }

    /// Gate and up in one tensor (`ffn_gate_up_exps`), streamed as the gate.
    pub(crate) fn is_fused(&self) -> bool {
        self.name.ends_with("ffn_gate_up_exps.weight")
    }

    /// Bytes of all its experts.
    pub fn bytes(&self) -> u64 {
        self.slice_bytes * u64::from(self.n_expert)
    }
}

/// One file of the model (the only one, or a shard of a split model).
#[derive(Debug, Clone)]
pub struct Shard {
    pub(crate) path: PathBuf,
    pub(crate) file_bytes: u64,
    /// Where byte 0 of this file lies in the streaming address space: the
    /// flash actor sees the shards one after another, each starting on a
    /// 4096-byte boundary (so O_DIRECT alignment is the same in both).
    pub(crate) base: u64,
    pub(crate) tensors: u32,
}

/// Shard bases are rounded up to this.
const SHARD_ALIGN: u64 = 4096;

/// The model seen as dense weights plus streamable expert slices.
#[derive(Debug, Clone)]
#[cfg_attr(test, derive(Default))]
pub struct MoeLayout {
    pub arch: String,
    pub n_layer: u32,
    pub n_layer_nextn: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    /// The first layers routed by token id through a table of `n_expert_used`
    /// experts per token (deepseek4's `hash_layer_count`).
    pub(crate) hash_layers: u32,
    pub experts: Vec<ExpertTensor>,
    /// What the tensor table holds: bytes by block, type and role.
    pub(crate) tally: TensorTally,
    /// Bytes of all files.
    pub(crate) file_bytes: u64,
    /// The model's files: one, or the shards of a split model in order.
    pub shards: Vec<Shard>,
    pub(crate) alignment: u64,
    /// Blocks the tensor table names (`blk.N.*`: the largest N + 1).
    pub(crate) blocks_in_table: u32,
    /// Tensors named like stacked experts (`blk.N.*exps.weight`) whose
    /// projection bmoe does not know: they are not streamed.
    pub(crate) unknown_experts: Vec<String>,
    /// What the header says about a context's memory (None: it lacks the
    /// attention hyperparameters; no memory check then).
    pub(crate) ctx: Option<CtxShape>,
    /// The last layers handed to RPC hosts ([`MoeLayout::hand_off`]).
    pub remote: Option<RemoteShare>,
}

/// The tensor table's bytes, by what they are.
#[derive(Debug, Clone, Default)]
pub(crate) struct TensorTally {
    pub(crate) total_bytes: u64,
    /// Tensor count and bytes per ggml type name.
    pub(crate) types: BTreeMap<String, (u32, u64)>,
    /// Bytes of each block's tensors (blocks the table names), and of the
    /// tensors outside blocks whose name starts with `output` (the output
    /// layer), and the token embedding's: what a remote share holds.
    pub(crate) block_bytes: BTreeMap<u32, u64>,
    pub(crate) output_bytes: u64,
    pub(crate) embd_bytes: u64,
    /// Whether the file has its own output matrix (`output.weight`); without
    /// one llama.cpp uses the token embedding as the output.
    pub(crate) output_matrix: bool,
}

/// N of a `blk.N.*` tensor name.
fn block_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
}

fn parse_expert_name(name: &str) -> Option<(u32, Proj)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let proj = match tail {
        "ffn_gate_exps.weight" => Proj::Gate,
        // Gate and up fused in one tensor (one slice per expert, gate rows
        // first): streamed in the gate's place, awaited with it at the routing.
        "ffn_gate_up_exps.weight" => Proj::Gate,
        "ffn_up_exps.weight" => Proj::Up,
        "ffn_down_exps.weight" => Proj::Down,
        _ => return None,
    };
    Some((layer, proj))
}

impl MoeLayout {
    /// The layout of a model in `files` (the first holds the metadata).
    pub(crate) fn from_files(files: &[GgufFile]) -> Self {
        let g = &files[0];
        let arch = g.arch().unwrap_or_else(|| "unknown".into());
        // Out-of-range values saturate (and `check` refuses them).
        let int = |k: &str| u32::try_from(g.arch_int(k).unwrap_or(0).max(0)).unwrap_or(u32::MAX);
        let block_count = int("block_count");
        let n_layer_nextn = int("nextn_predict_layers").min(block_count);
        let mut l = Self {
            arch,
            n_layer: block_count.saturating_sub(n_layer_nextn),
            n_layer_nextn,
            n_expert: int("expert_count"),
            n_expert_used: int("expert_used_count"),
            hash_layers: int("hash_layer_count"),
            experts: Vec::new(),
            tally: TensorTally::default(),
            file_bytes: 0,
            shards: Vec::new(),
            alignment: g.alignment(),
            blocks_in_table: 0,
            unknown_experts: Vec::new(),
            ctx: CtxShape::of(files),
            remote: None,
        };
        for f in files {
            l.add_file(f);
        }
        l.experts.sort_by_key(|e| (e.layer, e.proj));
        l
    }

    /// Add `f`'s tensors as the next shard.
    fn add_file(&mut self, f: &GgufFile) {
        let base = self.shards.last().map_or(0, |s| {
            (s.base + s.file_bytes).div_ceil(SHARD_ALIGN) * SHARD_ALIGN
        });
        let shard = self.shards.len();
        self.shards.push(Shard {
            path: f.path().to_path_buf(),
            file_bytes: f.file_bytes(),
            base,
            tensors: f.tensors().len() as u32,
        });
        self.file_bytes += f.file_bytes();
        for t in f.tensors() {
            match block_of(&t.name) {
                Some(b) => {
                    self.blocks_in_table = self.blocks_in_table.max(b.saturating_add(1));
                    *self.tally.block_bytes.entry(b).or_default() += t.size_bytes;
                }
                None if t.name.starts_with("output") => {
                    self.tally.output_bytes += t.size_bytes;
                    self.tally.output_matrix |= t.name == "output.weight";
                }
                None if t.name.starts_with("token_embd.") => self.tally.embd_bytes += t.size_bytes,
                None => {}
            }
            self.tally.total_bytes += t.size_bytes;
            let e = self.tally.types.entry(t.ggml_type.name()).or_default();
            e.0 += 1;
            e.1 += t.size_bytes;
            if let Some((layer, proj)) = parse_expert_name(&t.name) {
                self.experts
                    .push(expert_tensor(t, layer, proj, shard, base));
            } else if t.name.ends_with("exps.weight") {
                self.unknown_experts.push(t.name.clone());
            }
        }
    }

    /// The layout of the model at `path` (a file, or the first shard of a
    /// split model: every shard is checked).
    pub fn open(path: &Path) -> Result<Self, LlamaError> {
        let shards = GgufShards::open(path)?;
        let layout = Self::from_files(shards.files());
        layout.check().map_err(|detail| LlamaError::Corrupt {
            path: path.to_path_buf(),
            detail,
        })?;
        Ok(layout)
    }

    /// The expert tensors agree with the hyperparameters and the file: every
    /// slice lies inside the file, so no arithmetic on them can overflow.
    /// Returns what is wrong.
    pub(crate) fn check(&self) -> Result<(), String> {
        let blocks = self.n_layer + self.n_layer_nextn;
        if blocks != self.blocks_in_table {
            return Err(format!(
                "block_count is {blocks} but the tensor table has {} blocks",
                self.blocks_in_table
            ));
        }
        if self.n_expert_used > self.n_expert {
            return Err(format!(
                "expert_used_count {} exceeds expert_count {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if !self.experts.is_empty() && self.n_expert_used == 0 {
            return Err("expert_used_count is 0 but the file has expert tensors".into());
        }
        for e in &self.experts {
            if e.n_expert != self.n_expert {
                return Err(format!(
                    "{} stacks {} experts but expert_count is {}",
                    e.name, e.n_expert, self.n_expert
                ));
            }
            if e.layer >= blocks {
                return Err(format!(
                    "{} is in block {} but block_count is {blocks}",
                    e.name, e.layer
                ));
            }
            let end = e
                .slice_bytes
                .checked_mul(u64::from(e.n_expert))
                .and_then(|b| b.checked_add(e.file_offset));
            let file_bytes = self.shards[e.shard].file_bytes;
            if e.slice_bytes == 0 || end.is_none_or(|end| end > file_bytes) {
                return Err(format!(
                    "{}: {} slices of {} bytes at offset {} do not fit the file's {} bytes",
                    e.name, e.n_expert, e.slice_bytes, e.file_offset, file_bytes
                ));
            }
        }
        Ok(())
    }

    /// Whether the token embedding is also the output matrix (no `output.weight`).
    pub fn output_is_tied(&self) -> bool {
        !self.tally.output_matrix
    }

    /// The hidden state's width (None where the header lacks it).
    pub fn n_embd(&self) -> Option<u64> {
        self.ctx.as_ref().map(|c| c.n_embd)
    }

    /// The context the model was trained at (None where the header lacks it).
    pub fn n_ctx_train(&self) -> Option<u64> {
        self.ctx.as_ref().and_then(|c| c.n_ctx_train)
    }

    pub fn is_moe(&self) -> bool {
        self.n_expert > 0 && !self.experts.is_empty()
    }

    pub fn expert_bytes(&self) -> u64 {
        self.experts.iter().map(ExpertTensor::bytes).sum()
    }

    /// Bytes of the experts stored in file `shard`.
    pub(crate) fn shard_expert_bytes(&self, shard: usize) -> u64 {
        let of_shard = self.experts.iter().filter(|e| e.shard == shard);
        of_shard.map(ExpertTensor::bytes).sum()
    }

    pub(crate) fn is_split(&self) -> bool {
        self.shards.len() > 1
    }

    pub fn dense_bytes(&self) -> u64 {
        let remote = self.remote.as_ref().map_or(0, |r| r.local_bytes_freed);
        self.tally
            .total_bytes
            .saturating_sub(self.expert_bytes())
            .saturating_sub(remote)
    }

    /// Bytes of one expert slice per projection (from the first layer that has it).
    pub fn slice_bytes(&self, proj: Proj) -> Option<u64> {
        self.experts
            .iter()
            .find(|e| e.proj == proj)
            .map(|e| e.slice_bytes)
    }

    /// Bytes of one expert of `layer` (all projections).
    pub(crate) fn layer_expert_bytes(&self, layer: u32) -> u64 {
        self.experts
            .iter()
            .filter(|e| e.layer == layer)
            .map(|e| e.slice_bytes)
            .sum()
    }

    /// Routed expert bytes one token reads through the trunk (k experts per layer).
    pub fn routed_bytes_per_token(&self) -> u64 {
        self.routed_bytes(0..self.n_layer)
    }

    /// Routed expert bytes of one pass through the nextn (MTP) blocks.
    pub fn routed_bytes_per_mtp_pass(&self) -> u64 {
        self.routed_bytes(self.n_layer..self.n_layer + self.n_layer_nextn)
    }

    /// Routed expert bytes of one token through `layers` (k experts per layer).
    fn routed_bytes(&self, layers: std::ops::Range<u32>) -> u64 {
        self.experts
            .iter()
            .filter(|e| layers.contains(&e.layer))
            .map(|e| e.slice_bytes * self.n_expert_used as u64)
            .sum()
    }

    /// Layers whose gate and up experts are fused in one tensor.
    pub fn fused_layers(&self) -> Vec<u32> {
        let fused = self.experts.iter().filter(|e| e.is_fused());
        fused.map(|e| e.layer).collect()
    }

    /// Layers whose experts are stacked in separate gate/up/down tensors.
    pub fn expert_layers(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.experts.iter().map(|e| e.layer).collect();
        v.dedup();
        v
    }
}

fn expert_tensor(t: &TensorInfo, layer: u32, proj: Proj, shard: usize, base: u64) -> ExpertTensor {
    ExpertTensor {
        layer,
        proj,
        name: t.name.clone(),
        ggml_type: t.ggml_type,
        shard,
        file_offset: t.file_offset,
        stream_offset: base.saturating_add(t.file_offset),
        slice_bytes: t.slice_bytes(),
        n_expert: u32::try_from(t.ne[2]).unwrap_or(u32::MAX),
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
