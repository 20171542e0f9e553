//! A loaded llama.cpp model: metadata, vocabulary, tokenizer and chat template.

mod chat;
mod handle;
mod load;
mod vocab;

pub use chat::ChatMessage;
pub use handle::Model;
pub use load::{ModelParams, RpcPlacement};
