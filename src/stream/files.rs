//! The model's files and expert tensors as the flash actor and the read
//! probe see them.

use bmoe_flash::{ShardFile, TensorSpec};

use crate::layout::MoeLayout;

/// What the read probe reads: the file holding most expert bytes (the only
/// one, or a shard of a split model) and its expert slices as (file offset, bytes).
pub fn probe_slices(layout: &MoeLayout) -> (std::path::PathBuf, Vec<(u64, u64)>) {
    let shard = (0..layout.shards.len())
        .max_by_key(|&i| layout.shard_expert_bytes(i))
        .unwrap_or(0);
    let slices = layout
        .experts
        .iter()
        .filter(|e| e.shard == shard)
        .flat_map(|e| (0..e.n_expert).map(move |x| (e.slice_offset(x), e.slice_bytes)))
        .collect();
    let path = layout.shards.get(shard).map(|s| s.path.clone());
    (path.unwrap_or_default(), slices)
}

/// The model's files as the flash actor reads them.
pub(super) fn shard_files(layout: &MoeLayout) -> Vec<ShardFile> {
    layout
        .shards
        .iter()
        .map(|s| ShardFile {
            path: s.path.clone(),
            base: s.base,
        })
        .collect()
}

/// The expert tensors, as the flash actor reads them.
pub(super) fn specs(layout: &MoeLayout) -> Vec<TensorSpec> {
    layout
        .experts
        .iter()
        .map(|e| TensorSpec {
            layer: e.layer,
            proj: e.proj,
            file_offset: e.stream_offset,
            slice_bytes: e.slice_bytes,
            n_expert: e.n_expert,
        })
        .collect()
}
