//! gguf files through ggml's own reader/writer: the tensor table with absolute
//! file offsets (where expert bytes live), metadata access, and a streaming
//! writer used by the fixtures.

mod file;
pub(crate) mod split;
mod write;

pub(crate) use file::MetaValue;
pub use file::{GgufFile, TensorInfo};
pub(crate) use split::GgufShards;
pub use write::{hex, GgufBuilder, Written};
