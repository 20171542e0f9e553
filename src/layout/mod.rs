//! Where a model's expert bytes live: the MoE layout read from the gguf tensor
//! table (no weights loaded). Used by `inspect` and by the streaming engine.
//!
//! This file is the room's face: the files of the room import each other by
//! path, never through it.

mod ctx_shape;
mod moe;
mod remote;
mod remote_share;

pub(crate) use ctx_shape::CtxShape;
pub use moe::{ExpertTensor, MoeLayout, Proj, Shard};
#[cfg(test)]
pub(crate) use remote::tests::two_blocks;
pub use remote_share::{HeldLayers, RemoteShare};
