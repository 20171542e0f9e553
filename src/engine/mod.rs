//! Engine assembly for `bmoe run`, `chat` and `serve`: resident (plain
//! llama.cpp mmap) or streamed (flash actor + verify hook), generation,
//! per-token accounting.
//!
//! This file is the room's face: its modules and what the other rooms may
//! name. The files of the room import each other by path
//! (`super::config::RunConfig`), never through this face
//! (tests/integration/architecture.rs checks it).

mod assemble;
mod config;
mod ctx_check;
mod error;
mod finish;
pub mod fits;
pub mod graph_check;
mod mode;
mod note;
mod prefill;
pub mod prompt_state;
mod refusal;
mod report;
mod rpc;
mod rpc_config;
mod rpc_summary;
mod run;
mod run_report;
mod session;
mod sink;
mod startup;
mod state_error;
mod summary;

pub use config::{
    JobConfig, PromptStates, RunConfig, SpecConfig, Speculation, DEFAULT_DRAFT, DEFAULT_N_CTX,
    DEFAULT_N_PREDICT, MAX_DRAFT, MTP_UBATCH,
};
pub use error::EngineError;
pub use mode::{Asked, Mode};
pub use note::{Note, RpcSplit};
pub use prefill::{choose_ubatch, PrefillReport, Ubatch, TARGET_UBATCH, UBATCH_MAX};
pub use refusal::Refusal;
pub use report::DecodeSplit;
pub use rpc_config::{RpcConfig, RpcLayers, DEFAULT_RPC_TIMEOUT};
pub use run::run;
pub use run_report::{FlashTotals, MemoryTotals, PrefetchReport, RunReport};
pub use session::{Session, Turn, TurnFigures};
