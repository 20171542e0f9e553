//! The FFI seam: the only place in bmoe that calls llama.cpp / ggml / gguf.
//!
//! Everything outside this module sees safe types: [`Model`], [`Context`],
//! [`Batch`], [`gguf::GgufFile`], [`gguf::GgufBuilder`] and the quantization
//! helpers in [`quant`]. Every `unsafe` block states why it is sound.

mod backend;
mod batch;
mod context;
mod error;
mod eval;
pub mod gguf;
pub mod grammar;
mod header;
pub mod matvec;
mod model;
mod mtp;
mod populate;
pub mod quant;
pub mod rpc;
mod sampler;
pub mod schema_check;
mod seq_state;
mod target;
mod utf8_guard;

pub use batch::{Batch, Token};
pub use context::{default_threads, Context, ContextKind, ContextParams, MAX_SEQUENCES};
pub use error::LlamaError;
pub use eval::{llama_max_src, BatchShape, EvalObserver, NodeView, ObserverFailure};
pub use grammar::{Grammar, GrammarError};
pub use model::{ChatMessage, Model, ModelParams, RpcPlacement};
pub use mtp::MtpHead;
pub(crate) use sampler::Sampler;
pub use target::{Target, TargetTurn};
