//! The last layers of a model handed to RPC hosts (`--rpc`): llama.cpp puts
//! the last N blocks and the output layer in the hosts' memory, so bmoe
//! streams, caches and counts only the layers that stay local.

use super::moe::MoeLayout;
use super::remote_share::RemoteShare;

impl MoeLayout {
    /// Blocks in all (trunk + nextn): what llama.cpp's layer placement counts.
    pub fn blocks(&self) -> u32 {
        self.n_layer + self.n_layer_nextn
    }

    /// Bytes the last `blocks` blocks and the output layer take (what the
    /// hosts must hold), without changing the layout.
    pub fn remote_bytes(&self, blocks: u32) -> u64 {
        let first = self.blocks().saturating_sub(blocks);
        let layers: u64 = self.tally.block_bytes.range(first..).map(|(_, b)| *b).sum();
        // A model without output.weight reuses the token embedding, which
        // llama.cpp then places with the output layer as well.
        let tied = if self.output_is_tied() {
            self.tally.embd_bytes
        } else {
            0
        };
        layers + self.tally.output_bytes + tied
    }

    /// The most trailing blocks whose bytes fit in `free_bytes` (with an
    /// eighth kept for the hosts' KV cache and compute buffers).
    pub fn blocks_fitting(&self, free_bytes: u64) -> u32 {
        let room = free_bytes - free_bytes / 8;
        (0..=self.blocks())
            .take_while(|&n| self.remote_bytes(n) <= room)
            .last()
            .unwrap_or(0)
    }

    /// Hand the last `blocks` blocks (and the output layer) to RPC hosts:
    /// their experts leave the layout (nothing of them is streamed, cached or
    /// dropped from the mapping here), their bytes leave the local counts.
    pub fn hand_off(&mut self, blocks: u32) -> &RemoteShare {
        let blocks = blocks.min(self.blocks());
        let first_block = self.blocks() - blocks;
        self.experts.retain(|e| e.layer < first_block);
        let layers: u64 = self
            .tally
            .block_bytes
            .range(first_block..)
            .map(|(_, b)| *b)
            .sum();
        let share = RemoteShare {
            first_block,
            blocks,
            remote_bytes: self.remote_bytes(blocks),
            // The remote blocks (dense and experts) and the output layer (a
            // tied embedding stays here too, for the input).
            local_bytes_freed: layers + self.tally.output_bytes,
            local_routed_bytes_per_token: 0,
        };
        self.remote = Some(share);
        let routed = self.routed_bytes_per_token();
        let r = self.remote.as_mut().expect("set above");
        r.local_routed_bytes_per_token = routed;
        r
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::layout::moe::{ExpertTensor, Proj};
    use crate::llama::quant::GgmlType;

    /// Two blocks of 1000 bytes each, 600 of them experts (3 x 200); an
    /// output layer of 300; an embedding of 400.
    pub(crate) fn two_blocks() -> MoeLayout {
        let expert = |layer: u32, proj: Proj| ExpertTensor {
            layer,
            proj,
            name: format!("blk.{layer}.ffn_{proj:?}_exps.weight"),
            ggml_type: GgmlType::F32,
            shard: 0,
            file_offset: 0,
            stream_offset: 0,
            slice_bytes: 50,
            n_expert: 4,
        };
        let experts = (0..2)
            .flat_map(|l| [Proj::Gate, Proj::Up, Proj::Down].map(|p| expert(l, p)))
            .collect();
        MoeLayout {
            arch: "llama".into(),
            n_layer: 2,
            n_expert: 4,
            n_expert_used: 2,
            experts,
            tally: crate::layout::moe::TensorTally {
                total_bytes: 2700,
                block_bytes: BTreeMap::from([(0, 1000), (1, 1000)]),
                output_bytes: 300,
                embd_bytes: 400,
                output_matrix: true,
                ..Default::default()
            },
            file_bytes: 2800,
            alignment: 32,
            blocks_in_table: 2,
            ..MoeLayout::default()
        }
    }

    #[test]
    fn handing_off_a_layer_leaves_only_local_experts_and_bytes() {
        let mut l = two_blocks();
        assert_eq!(l.dense_bytes(), 2700 - 1200);
        assert_eq!(l.remote_bytes(1), 1000 + 300);
        assert_eq!(l.remote_bytes(2), 2000 + 300);
        let share = l.hand_off(1).clone();
        assert_eq!((share.first_block, share.blocks), (1, 1));
        assert!(l.experts.iter().all(|e| e.layer == 0));
        assert_eq!(l.expert_bytes(), 600);
        // Block 0's 400 dense bytes and the embedding's 400 stay here.
        assert_eq!(l.dense_bytes(), 800);
        assert_eq!(share.remote_bytes, 1300);
        assert_eq!(share.local_routed_bytes_per_token, 3 * 50 * 2);
    }

    #[test]
    fn a_tied_output_takes_the_embedding_along_and_auto_fits_what_is_free() {
        let mut l = two_blocks();
        // output_norm only: the output reuses token_embd.
        (l.tally.output_bytes, l.tally.output_matrix) = (4, false);
        assert_eq!(l.remote_bytes(1), 1000 + 4 + 400);
        // An eighth is kept for the hosts' KV and buffers.
        assert_eq!(l.blocks_fitting(1404 * 8 / 7 + 1), 1);
        assert_eq!(l.blocks_fitting(1403), 0);
        assert_eq!(l.blocks_fitting(u64::MAX / 2), 2);
        assert_eq!(l.hand_off(9).blocks, 2);
    }
}
