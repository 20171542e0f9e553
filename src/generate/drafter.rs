//! Draft sources for the verify loop: the [`Drafter`] trait, the MTP head on
//! this thread ([`MtpDrafter`]) and the n-gram matcher ([`NgramDrafter`]).

use super::error::GenerateError;
use super::outcome::GateStep;
use crate::llama::{Batch, MtpHead, Target, TargetTurn, Token};

/// A source of draft tokens for the verify loop, for a generation holding the
/// target context for `'t`. Every call lends the source the target: a source
/// may read it only then. Besides [`draft`](Self::draft), a source that reads
/// the target's hidden states (the MTP head) [follows](Self::follow) every
/// change of the target's cache; the others ignore it.
pub trait Drafter<'t> {
    /// The source's name (`ngram`, `mtp`), for spans.
    fn name(&self) -> &'static str {
        "draft"
    }
    /// Up to `max` tokens to verify after `corpus` (the prompt and every
    /// confirmed token; its last token is the one about to be decoded, at
    /// position `corpus.len() - 1`). An empty draft takes the plain
    /// single-token path.
    fn draft(&mut self, target: &mut Target<'t>, corpus: &[Token], max: usize) -> Drafted;
    /// What happened to the target's cache (see [`Follow`]); nothing by default.
    fn follow(
        &mut self,
        _target: &mut Target<'t>,
        _event: Follow<'_>,
    ) -> Result<(), GenerateError> {
        Ok(())
    }
    /// How sure the source was of each token of its last draft (the n-gram
    /// match length; empty: nothing to say).
    fn evidence(&self) -> Vec<f32> {
        Vec::new()
    }
    /// What the speculation gate decided for the last draft (gated sources).
    fn gate_step(&self) -> Option<GateStep> {
        None
    }
    /// Whether the source reads the target's past (the MTP head's hidden
    /// states), so it must see the whole prompt decoded: no prefix reused
    /// from the KV cache. A source that reads only the tokens does not.
    fn follows_target(&self) -> bool {
        true
    }
}

/// A source's drafts for one step.
pub type Drafted = Result<Vec<Token>, GenerateError>;

/// What a source that follows the target is told.
#[derive(Clone, Copy)]
pub enum Follow<'a> {
    /// The prompt is in the target's cache.
    Begin(&'a [Token]),
    /// The target decoded this batch: a prefill chunk, or the kept rows of a
    /// verify batch (`[last, d1..dk]`, the rejected tail already cut off).
    Decoded(&'a Batch),
    /// The verify step kept `accepted` of `drafted` drafts; the target's cache
    /// now ends before position `n_past` (the next token goes there).
    Accepted(Accepted),
    /// Drop everything the source keeps of the target's past (the MTP head's
    /// own cache): it follows again from the next decoded batch it is told
    /// of, which may start at any position. For a gated head at rest.
    Forget,
}

/// What a verify step kept: `accepted` of `drafted` drafts, the next token at
/// `n_past`; and what it cost: the verify decode and the drafting before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    pub(crate) n_past: i32,
    pub(crate) verify: std::time::Duration,
    pub(crate) draft: std::time::Duration,
}

/// The MTP drafter (`--mtp`): the model's own nextn head on a draft context.
/// Its methods take the target as a [`TargetTurn`], which the draft actor
/// receives on its own thread; the [`Drafter`] impl uses the [`Target`]'s.
pub struct MtpDrafter {
    head: MtpHead,
}

impl MtpDrafter {
    pub fn new(head: MtpHead) -> Self {
        Self { head }
    }

    /// What the head's own decodes streamed since the last call.
    pub(crate) fn take_metrics(&mut self) -> bmoe_decode::metrics::DecodeMetrics {
        self.head.take_metrics()
    }

    /// The first error of the head's streaming hook.
    pub(crate) fn failure(&self) -> Option<crate::llama::ObserverFailure> {
        self.head.observer_failure()
    }

    /// [`Drafter::draft`] with the target lent as a turn.
    pub(crate) fn draft_in(
        &mut self,
        turn: &mut TargetTurn<'_>,
        corpus: &[Token],
        max: usize,
    ) -> Result<Vec<Token>, GenerateError> {
        let n_past = corpus.len() as i32 - 1;
        let last = *corpus.last().ok_or(GenerateError::EmptyPrompt)?;
        let d = self.head.draft(turn, n_past, last, corpus, max)?;
        // Positions in the draft context only move forward: drop what the
        // drafting pass put after the last confirmed token.
        self.head.trim_draft(n_past);
        Ok(d)
    }

    /// [`Drafter::follow`] with the target lent as a turn.
    pub(crate) fn follow_in(
        &mut self,
        turn: &mut TargetTurn<'_>,
        event: Follow<'_>,
    ) -> Result<(), GenerateError> {
        match event {
            Follow::Begin(prompt) => self.head.begin(turn, prompt)?,
            Follow::Decoded(batch) => self.head.process(turn, batch)?,
            Follow::Accepted(step) => {
                if step.drafted > 0 {
                    self.head.accept(turn, step.accepted)?;
                }
                self.head.trim_draft(step.n_past);
            }
            Follow::Forget => self.head.forget()?,
        }
        Ok(())
    }
}

impl<'t> Drafter<'t> for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn draft(&mut self, target: &mut Target<'t>, corpus: &[Token], max: usize) -> Drafted {
        self.draft_in(target.turn()?, corpus, max)
    }

    fn follow(&mut self, target: &mut Target<'t>, event: Follow<'_>) -> Result<(), GenerateError> {
        self.follow_in(target.turn()?, event)
    }
}

/// The n-gram drafter (`--ngram`): the pure matcher of `bmoe_decode::ngram`.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    pub(crate) min_match: usize,
    pub(crate) max_match: usize,
    /// The corpus as the matcher's ids (grown as tokens are confirmed).
    ids: Vec<u32>,
    /// The last draft's match length and token count.
    last: (usize, usize),
}

impl NgramDrafter {
    pub(crate) fn new(min_match: usize) -> Self {
        Self {
            min_match,
            max_match: bmoe_decode::ngram::DEFAULT_MAX_MATCH,
            ids: Vec::new(),
            last: (0, 0),
        }
    }
}

impl<'t> Drafter<'t> for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    /// The matcher reads the corpus's tokens only: a reused prefix is fine.
    fn follows_target(&self) -> bool {
        false
    }

    fn draft(&mut self, _target: &mut Target<'t>, corpus: &[Token], max: usize) -> Drafted {
        // The corpus only grows (rejected drafts never enter it): convert the new tail.
        if self.ids.len() > corpus.len() {
            self.ids.clear();
        }
        let from = self.ids.len();
        self.ids.extend(corpus[from..].iter().map(|&t| t as u32));
        let cfg = bmoe_decode::ngram::NgramConfig {
            min_match: self.min_match,
            max_match: self.max_match,
            max_draft: max,
        };
        let d = bmoe_decode::ngram::draft(&self.ids, &cfg);
        self.last = d.as_ref().map_or((0, 0), |d| (d.match_len, d.tokens.len()));
        Ok(
            d.map(|d| d.tokens.into_iter().map(|t| t as Token).collect())
                .unwrap_or_default(),
        )
    }

    fn evidence(&self) -> Vec<f32> {
        vec![self.last.0 as f32; self.last.1]
    }
}
