//! What every handler shares: the engine's queue, the server's settings and
//! what loading said about the model; a response's id.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::job::Job;
use super::tenant::CacheScope;

/// Shared by the handlers: the queue and what they say about the model.
pub(crate) struct Shared {
    pub(crate) jobs: crossbeam_channel::Sender<Job>,
    /// The model's name in replies: the first served name.
    pub(crate) model_id: String,
    /// The names `/v1/models` lists (`--served-name`, else the file's stem).
    pub(crate) served_names: Vec<String>,
    pub(crate) defaults: bmoe_decode::sampling::SamplingParams,
    /// `--api-key`s (none: no key asked); each is a tenant of its own.
    pub(crate) api_keys: Vec<String>,
    /// `--prompt-cache-scope`: tenants within a key.
    pub(crate) cache_scope: CacheScope,
    pub(crate) body_limit_bytes: usize,
    pub(crate) next_id: std::sync::atomic::AtomicU64,
    /// This run's random part of every response id (ids stay unique across
    /// restarts; see [`reply_id`]).
    pub(crate) run_id: String,
    /// Positions a request's sequence holds, prompt and reply together
    /// (`/v1/models`' `context_length`).
    pub(crate) context_length: u32,
    /// A request's `max_tokens` when it gives none (`bmoe serve -n`).
    pub(crate) default_max_tokens: u32,
    /// How the chat template has the model write tool calls.
    pub(crate) call_format: crate::chat::tool_calls::CallFormat,
    /// Whether the chat template writes `<think>` reasoning blocks.
    pub(crate) thinks: bool,
    /// Seconds since the epoch when the server started (`/v1/models`'
    /// `created`; each response carries its own time).
    pub(crate) created_s: u64,
}

pub(crate) type App = Arc<Shared>;

/// A response's id: `prefix`, `bmoe`, this run's random part and the
/// request's number, unique across restarts as well as within a run.
pub(crate) fn reply_id(app: &Shared, prefix: &str) -> String {
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}bmoe{}-{n}", app.run_id)
}
