//! What a generation is asked (its [`Options`] and [`Limit`]) and what it
//! gives back: the [`Generation`], its speculation counters, every decode's
//! [`DecodeStep`] for the [`GenerationSink`] and the gate's decisions.

use std::time::Duration;

use bmoe_decode::metrics::DecodeMetrics;
use bmoe_decode::sampling::SamplingParams;
use bmoe_decode::spec_gate::{Choice, Source};

use crate::llama::Token;

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

/// What the gate decided on one step, for the telemetry row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateStep {
    /// The source whose draft the gate judged.
    pub(crate) source: Source,
    /// Drafts the source had.
    pub(crate) available: usize,
    pub(crate) choice: Choice,
}

/// The gate's decisions over a run (the summary's `spec-gate:` line).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GateStats {
    pub steps: u64,
    /// Steps that verified at least one draft, and the drafts they verified.
    pub(crate) drafted_steps: u64,
    pub(crate) drafted: u64,
    /// Steps whose source had nothing to draft.
    pub(crate) no_draft: u64,
    /// Steps that verified fewer drafts than the source had, and of them the
    /// ones that verified none.
    pub(crate) shortened: u64,
    pub(crate) held_to_plain: u64,
    /// One-token drafts taken against the estimates to refresh them.
    pub explored: u64,
    /// Steps that verified drafts, per source (`Source as usize`).
    pub(crate) drafted_steps_by: [u64; 2],
    /// Steps the MTP head rested (no catch-up), and the times it woke.
    pub rested: u64,
    pub woke: u64,
}
