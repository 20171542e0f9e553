//! Greedy generation on one context (the resident path that streaming and
//! speculation are compared against), with optional drafts verified by the
//! target: the types here, the loop in `verify`, the draft sources in `drafter`.

mod drafter;
mod emit;
mod gated;
mod multi;
mod picker;
mod verify;

use std::time::Duration;

use bmoe_decode::metrics::DecodeMetrics;
use bmoe_decode::sampling::SamplingParams;

use crate::chat::{ChatTemplate, TemplateError};
use crate::llama::{Context, LlamaError, Model, Token};

pub use drafter::{Accepted, Drafted, Drafter, Follow, MtpDrafter, NgramDrafter};
pub use gated::{GateStats, GateStep, GatedDrafter, Sources};
pub(crate) use multi::{common_prefix, Finished, Multi, Request, Step};
pub use verify::{generate_opts, generate_with};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Llama(#[from] LlamaError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("the prompt is empty: it has no tokens (give text with -p/--prompt or -f/--file; with a chat template, one that renders the conversation as text)")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}; raise -c/--ctx or shorten the prompt")]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    #[error("llama.cpp returned no logits for the last position")]
    NoLogits,
    #[error("the model computed NaN for the next token's scores: its tensor data is likely corrupt; check the file against its published checksum, or download it again")]
    NanLogits,
    #[error("could not trim the rejected drafts from the KV cache at position {pos}")]
    Rollback { pos: i32 },
    #[error("drafts are verified against greedy picks on a prompt prefilled from its start: speculation needs temperature 0 and no reused prefix")]
    DraftNeedsGreedy,
    #[error("drafts are verified against the target's own argmax, which a grammar does not constrain: a constrained generation runs without speculation")]
    DraftWithGrammar,
    #[error("the output grammar allows no token here (none of the vocabulary's tokens continues it, or it is complete and the end of text is banned)")]
    GrammarDeadEnd,
    #[error("every sequence of the context is generating")]
    NoFreeSequence,
    #[error("MTP draft actor: {0}")]
    DraftActor(String),
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfText,
    /// `-n` tokens were generated.
    Limit,
    /// The context is full.
    ContextFull,
    /// The text reached one of the stop strings (which is not part of it).
    StopString,
    /// The sink asked to stop (an interrupt).
    Interrupted,
}

/// The outcome of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub(crate) prompt_tokens: usize,
    /// Generated tokens (an end-of-generation token is not included).
    pub tokens: Vec<Token>,
    pub text: String,
    pub stop: StopReason,
    pub(crate) prefill: Duration,
    pub(crate) decode: Duration,
    /// Speculation counters (all zero without a drafter).
    pub spec: SpecStats,
}

/// What speculation did over one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Decode steps after the prefill (plain or verify).
    pub steps: u64,
    /// Steps whose drafter proposed at least one token (verify decodes).
    pub drafted_steps: u64,
    /// Draft tokens proposed, and how many the target's argmax confirmed.
    pub drafted: u64,
    pub accepted: u64,
    /// Time spent drafting, the drafter's catch-up on each verify step included.
    pub(crate) draft: Duration,
    /// Verify-loop time outside decodes and drafting (see [`DecodeStep`]).
    pub(crate) loop_overhead: Duration,
    /// What the speculation gate decided (gated runs only).
    pub(crate) gate: Option<GateStats>,
}

/// One `llama_decode` call as seen by a [`GenerationSink`].
#[derive(Debug, Clone)]
pub struct DecodeStep {
    /// Tokens in the batch.
    pub(crate) n_tokens: usize,
    /// Part of the prompt prefill (the last prefill decode yields the first token).
    pub(crate) prefill: bool,
    pub(crate) elapsed: Duration,
    /// Speculation: time spent drafting this decode's batch (zero otherwise).
    pub(crate) draft: Duration,
    /// Verify-loop time since the previous decode ended that was neither
    /// drafting nor a decode (picking and emitting tokens, the sink's own work,
    /// trimming the KV cache); zero for the prompt's decodes and the first.
    pub(crate) loop_overhead: Duration,
    /// What the speculation gate decided for this decode (gated runs only).
    pub(crate) gate: Option<GateStep>,
    /// What the decode's expert streaming cost (zeros on a resident context).
    pub(crate) metrics: DecodeMetrics,
}

/// Receives generated text and per-decode timing.
pub trait GenerationSink {
    /// Complete text, as soon as it is known.
    fn text(&mut self, _piece: &str) {}
    /// A decode finished.
    fn decoded(&mut self, _step: DecodeStep) {}
    /// The same decode produced one more token (speculation accepted a draft):
    /// the text that follows belongs to a new token.
    fn next_token(&mut self) {}
    /// Checked at every token boundary: true stops generation there.
    fn should_stop(&mut self) -> bool {
        false
    }
}

impl<F: FnMut(&str)> GenerationSink for F {
    fn text(&mut self, piece: &str) {
        self(piece)
    }
}

/// Turn user text into prompt tokens: as one user message through `template`
/// when given (the path `bmoe chat` and `serve` take), else as plain text.
pub fn prompt_tokens(
    model: &Model,
    text: &str,
    template: Option<&ChatTemplate>,
) -> Result<Vec<Token>, GenerateError> {
    let tokens = if let Some(template) = template {
        template.user_prompt(model, text)?.1
    } else {
        model.tokenize(text, true, false)?
    };
    if tokens.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    Ok(tokens)
}

/// When generation stops: after `n_predict` tokens, or earlier at the end of
/// text unless `ignore_eos` (then end-of-generation tokens are never chosen:
/// the greedy pick is the best other token, as llama.cpp's `--ignore-eos` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub n_predict: u32,
    pub(crate) ignore_eos: bool,
}

impl Default for Limit {
    fn default() -> Self {
        Self::from(u32::MAX)
    }
}

/// How one generation picks tokens and ends.
#[derive(Debug, Clone)]
pub struct Options {
    pub limit: Limit,
    /// Tokens per prefill decode.
    pub n_batch: usize,
    /// Greedy (the default) or a seeded draw.
    pub sampling: SamplingParams,
    /// Text that ends generation where it first appears (and is left out).
    pub stop: Vec<String>,
    /// Drafted tokens per verify step at most.
    pub draft_max: usize,
    /// How many of the prompt's first tokens the context's KV cache already
    /// holds from the previous generation (they are not decoded again).
    pub cached: usize,
    /// Control tokens go out as their text (gpt-oss's `<|channel|>` and
    /// such, which its replies are split by) instead of as nothing.
    pub special_text: bool,
    /// Output held to this grammar (structured output, forced tool calls).
    pub grammar: Option<crate::llama::Grammar>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            limit: Limit::default(),
            n_batch: 512,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            draft_max: 0,
            cached: 0,
            special_text: false,
            grammar: None,
        }
    }
}

impl From<u32> for Limit {
    fn from(n_predict: u32) -> Self {
        Self {
            n_predict,
            ignore_eos: false,
        }
    }
}

/// Greedy generation of up to `limit` tokens after `prompt`; `sink` gets each
/// complete piece of text as soon as it is known and each decode's timing.
pub fn generate(
    ctx: &mut Context,
    prompt: &[Token],
    limit: impl Into<Limit>,
    n_batch: usize,
    sink: &mut dyn GenerationSink,
) -> Result<Generation, GenerateError> {
    generate_with(ctx, prompt, limit, n_batch, sink, None, 0)
}
