//! The job every dialect's request becomes and the events it answers with:
//! what the engine thread and the three dialects (`openai/`, `anthropic/`,
//! `responses/`) share. A leaf beside `error.rs`: it imports no other file of
//! serve but that one, and every dialect imports it.

use bmoe_decode::sampling::SamplingParams;
use serde_json::Value;
use tokio::sync::mpsc;

use super::error::ApiError;
use crate::chat::tool_grammar::ToolChoice;
use crate::chat::{Message, TemplateOptions};
use crate::engine::TurnFigures;

/// Stop strings a request may give at most.
pub(crate) const MAX_STOP_STRINGS: usize = 16;

/// The `requester` label of a request without a `user`.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Longest `requester` label kept (longer ids are cut).
pub(crate) const REQUESTER_MAX_CHARS: usize = 64;

/// Events a job sends back to its request before it is done.
pub(crate) const EVENT_CAPACITY: usize = 64;

/// What a request asks the engine for, checked.
#[derive(Debug, Clone)]
pub(crate) struct JobSpec {
    pub(crate) prompt: PromptSpec,
    pub(crate) sampling: SamplingParams,
    pub(crate) stop: Vec<String>,
    /// None: the server's `-n` (set when the job is queued); either is
    /// capped to what the context leaves.
    pub(crate) max_tokens: Option<u32>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// The request's `user`, cut to [`REQUESTER_MAX_CHARS`], or [`ANONYMOUS`].
    pub(crate) requester: String,
    /// Only count the prompt's tokens (`/v1/messages/count_tokens`): the
    /// job ends with its `Started` event.
    pub(crate) count_only: bool,
    /// What the reply is held to (a grammar in the sampler).
    pub(crate) constraint: Constraint,
}

#[derive(Debug, Clone)]
pub(crate) enum PromptSpec {
    Chat {
        messages: Vec<Message>,
        /// The request's `tools`, as given.
        tools: Option<Value>,
        options: TemplateOptions,
    },
    Text(String),
}

impl PromptSpec {
    pub(crate) fn is_chat(&self) -> bool {
        matches!(self, PromptSpec::Chat { .. })
    }

    /// The tools a chat offers, if any.
    pub(crate) fn tools(&self) -> Option<&Value> {
        match self {
            PromptSpec::Chat { tools, .. } => tools.as_ref(),
            PromptSpec::Text(_) => None,
        }
    }
}

/// A request's constraint on its reply (`constraint.rs` builds its grammar).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Constraint {
    /// Free text (calls, if tools are offered, parsed back only).
    #[default]
    None,
    /// JSON valid against this schema; `param` names the request field.
    Json { schema: Value, param: &'static str },
    /// The offered tools' calls, forced or lazy.
    Calls(ToolChoice),
}

/// One request's work.
pub(crate) struct Job {
    pub(crate) spec: JobSpec,
    pub(crate) events: mpsc::Sender<Event>,
    /// The request's span (method, path): the engine thread's log of the job
    /// is said inside it.
    pub(crate) span: tracing::Span,
    /// Whose cached prefixes it may reuse (its tenant, `tenant::scope_of`):
    /// never another scope's, in a KV sequence or in the prompt cache.
    pub(crate) scope: u64,
}

/// What a job reports to its request, in order: `Started` or `Failed` first.
#[derive(Debug)]
pub(crate) enum Event {
    /// The prompt is in (see [`Started`]).
    Started(Started),
    Text(String),
    Done(Box<Done>),
    Failed(ApiError),
}

/// What a job said when it started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    pub(crate) prompt_tokens: usize,
    /// The most tokens the reply may have (the request's `max_tokens`
    /// capped to what the context leaves; 0 for a job that only counts).
    pub(crate) max_tokens: u32,
    /// The rendered prompt ends inside a reasoning block (`<think>`).
    pub(crate) reasoning_open: bool,
    /// A grammar holds the reply's tool calls to the template's format.
    pub(crate) calls_held: bool,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    /// OpenAI's `finish_reason`: "stop" or "length".
    pub(crate) finish_reason: &'static str,
    /// The stop string that ended the text, if one did.
    pub(crate) stop_sequence: Option<String>,
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) figures: TurnFigures,
    pub(crate) notes: Vec<String>,
}

/// Seconds since the epoch now (OpenAI's `created`).
pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
