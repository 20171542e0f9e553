//! What went to the RPC hosts (`--rpc`): the remote blocks and the local
//! bytes they freed.

/// What went to the RPC hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteShare {
    /// The first block held remotely (blocks from here to the last are remote).
    pub first_block: u32,
    /// Blocks held remotely.
    pub blocks: u32,
    /// Bytes the hosts hold: the blocks, the output layer (the token
    /// embedding again when the output is tied to it).
    pub remote_bytes: u64,
    /// Bytes that leave this host's dense weights and experts.
    pub(crate) local_bytes_freed: u64,
    /// Expert bytes one token reads on this host (k experts of each local layer).
    pub local_routed_bytes_per_token: u64,
}

impl RemoteShare {
    /// What the hosts hold, as a message names it ("layers 15..=29 and the
    /// output layer").
    pub fn held_layers(&self) -> HeldLayers {
        HeldLayers {
            first_block: self.first_block,
            blocks: self.blocks,
        }
    }
}

/// The layers a [`RemoteShare`] puts on the hosts, written in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLayers {
    first_block: u32,
    blocks: u32,
}

impl std::fmt::Display for HeldLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.blocks {
            0 => f.write_str("the output layer"),
            n => write!(
                f,
                "layers {}..={} and the output layer",
                self.first_block,
                self.first_block + n - 1
            ),
        }
    }
}
