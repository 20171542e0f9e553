//! One generation in the loop's batch ([`super::multi::Multi`]): while its
//! prompt is fed, a chunk of it per decode; after, `[last, d1..dk]` (k = 0
//! without a draft), keeping the drafts the target's own argmax confirms plus
//! the target's next token, the rejected tail trimmed from its KV sequence.

use std::time::{Duration, Instant};

use bmoe_decode::metrics::DecodeMetrics;

use super::drafter::{Accepted, Drafter, Follow};
use super::emit::Emitter;
use super::error::GenerateError;
use super::outcome::{GateStep, Generation, GenerationSink, Options, SpecStats, StopReason};
use super::picker::Picker;
use crate::llama::{Batch, Context, Model, Target, Token};

/// One generation to run beside others.
pub(crate) struct Request<S> {
    pub(crate) prompt: Vec<Token>,
    pub(crate) opts: Options,
    pub(crate) sink: S,
    /// Who may reuse what it leaves in its sequence: a later request reuses
    /// a sequence's tokens only under the same scope (serve's tenants).
    pub(crate) scope: u64,
}

/// A generation in progress.
pub(super) struct Active<S> {
    pub(super) req: Request<S>,
    pub(super) picker: Picker,
    pub(super) out: Emitter,
    /// Prompt tokens whose KV entries an earlier generation left.
    pub(super) reused: usize,
    /// The token to decode next (None while the prompt is still being fed).
    pub(super) last: Option<Token>,
    /// This step's drafts after `last` (empty: the plain single-token decode).
    pub(super) draft: Vec<Token>,
    /// The prompt and every confirmed token (the drafters' corpus).
    pub(super) corpus: Vec<Token>,
    pub(super) spec: SpecStats,
    pub(super) clock: Clock,
    /// Its share of the decodes it took part in (see `Finished::share`).
    pub(super) share: DecodeMetrics,
}

/// When a generation's parts happened, and what its drafting cost.
pub(super) struct Clock {
    pub(super) t0: Instant,
    /// Until its first token was picked.
    pub(super) prefill: Duration,
    /// The drafter's catch-up on the previous verify step (drafting cost).
    catch_up: Duration,
    /// When its previous verify decode returned (the loop's overhead starts there).
    decode_end: Option<Instant>,
    /// This step's drafting, and what the gate decided for it.
    pub(super) draft: Duration,
    pub(super) gate: Option<GateStep>,
    /// The last verify decode's time and the drafting before it.
    costs: (Duration, Duration),
}

impl Clock {
    pub(super) fn new() -> Self {
        Self {
            t0: Instant::now(),
            prefill: Duration::ZERO,
            catch_up: Duration::ZERO,
            decode_end: None,
            draft: Duration::ZERO,
            gate: None,
            costs: (Duration::ZERO, Duration::ZERO),
        }
    }

    /// The loop's time between the previous verify decode and one that
    /// starts at `start`, drafting left out (zero for the first).
    pub(super) fn overhead(&self, start: Instant) -> Duration {
        self.decode_end
            .map_or(Duration::ZERO, |e| (start - e).saturating_sub(self.draft))
    }

    /// A verify decode from `start` took `elapsed`.
    pub(super) fn verified(&mut self, start: Instant, elapsed: Duration) {
        self.decode_end = Some(start + elapsed);
        self.costs = (elapsed, self.draft);
    }
}

impl<S: GenerationSink> Active<S> {
    /// Draft up to `room` tokens after `last` (what still fits in `-n`, the
    /// context and the batch besides), with the gate's decision when a gated
    /// drafter was asked (none when nothing fit).
    pub(super) fn draft<'t>(
        &mut self,
        target: &mut Target<'t>,
        drafter: Option<&mut (dyn Drafter<'t> + '_)>,
        room: usize,
    ) -> Result<(), GenerateError> {
        let tdraft = Instant::now();
        let room = room.min(self.req.opts.draft_max);
        let room = room.min(self.out.room().saturating_sub(1));
        let (draft, gate) = match drafter {
            Some(d) if room > 0 => {
                let pos = self.corpus.len();
                let draft = tracing::debug_span!("draft", source = d.name(), pos, max = room)
                    .in_scope(|| d.draft(target, &self.corpus, room))?;
                (draft, d.gate_step())
            }
            _ => (Vec::new(), None),
        };
        self.draft = draft;
        self.draft.truncate(room);
        // Drafting cost of this step: the drafting call, plus the drafter's
        // catch-up on the previous verify step (the MTP head's own decode).
        self.clock.draft = tdraft.elapsed() + std::mem::take(&mut self.clock.catch_up);
        self.clock.gate = gate;
        Ok(())
    }

    /// Keep the longest prefix of this step's drafts equal to the target's
    /// argmax (its rows from `base` in the batch), then the target's own token
    /// after it; the kept tokens. `held` is the sequence's KV tokens, the
    /// verify rows' among them: the rejected ones are dropped from it and from
    /// sequence `seq`'s cache.
    pub(super) fn accept(
        &mut self,
        ctx: &mut Context,
        (seq, base): (i32, usize),
        held: &mut Vec<Token>,
    ) -> Result<Vec<Token>, GenerateError> {
        let draft = std::mem::take(&mut self.draft);
        let mut ready = Vec::with_capacity(draft.len() + 1);
        let mut accepted = 0usize;
        loop {
            let t = self.picker.pick(ctx, (base + accepted) as i32)?;
            ready.push(t);
            if accepted < draft.len() && draft[accepted] == t {
                accepted += 1;
            } else {
                break;
            }
        }
        debug_assert!(
            self.picker.sampler.is_some()
                || ready.iter().enumerate().all(|(i, &t)| self
                    .picker
                    .pick(ctx, (base + i) as i32)
                    .ok()
                    == Some(t)),
            "every kept token is the argmax of the verify row that produced it"
        );
        self.spec.steps += 1;
        self.spec.draft += self.clock.draft;
        if !draft.is_empty() {
            self.spec.drafted_steps += 1;
            self.spec.drafted += draft.len() as u64;
            self.spec.accepted += accepted as u64;
            let pos = held.len() - (draft.len() - accepted);
            held.truncate(pos);
            if accepted < draft.len() && !ctx.trim_seq(seq, pos as i32, -1) {
                return Err(GenerateError::Rollback { pos: pos as i32 });
            }
        }
        self.clock.draft = Duration::ZERO;
        Ok(ready)
    }

    /// Tell the drafter what the verify step kept: the kept rows of `batch`
    /// (`[last, d1..dk]`, this sequence's alone when the drafter follows the
    /// target), then what was accepted, the next token at `n_past`.
    pub(super) fn follow_kept<'t>(
        &mut self,
        target: &mut Target<'t>,
        d: &mut (dyn Drafter<'t> + '_),
        batch: &mut Batch,
        (drafted, accepted, n_past): (usize, usize, usize),
    ) -> Result<(), GenerateError> {
        // The drafter catches up on the kept rows only, so it never holds a
        // rejected tail to drop.
        let tc = Instant::now();
        if d.follows_target() {
            batch.truncate(1 + accepted);
            d.follow(target, Follow::Decoded(batch))?;
        }
        let step = Accepted {
            drafted,
            accepted,
            n_past: n_past as i32,
            verify: self.clock.costs.0,
            draft: self.clock.costs.1,
        };
        d.follow(target, Follow::Accepted(step))?;
        self.clock.catch_up = tc.elapsed();
        Ok(())
    }

    /// Hand the tokens one decode determined (in order) to the sink; a stop
    /// when one ends the text or reaches `-n`. The last becomes `last`.
    pub(super) fn emit(&mut self, model: &Model, ready: Vec<Token>) -> Option<StopReason> {
        for (i, t) in ready.into_iter().enumerate() {
            if i > 0 {
                self.req.sink.next_token();
            }
            self.last = Some(t);
            let stop = self.out.token(model, t, &mut self.req.sink);
            if stop != Some(StopReason::EndOfText) {
                self.corpus.push(t);
            }
            if stop.is_some() {
                return stop;
            }
        }
        None
    }

    /// The generation as it ended: the last catch-up is drafting cost too,
    /// and any incomplete UTF-8 tail is flushed.
    pub(super) fn finish(&mut self, stop: StopReason) -> Generation {
        self.spec.draft += self.clock.catch_up;
        self.out.finish(stop, &mut self.req.sink);
        let elapsed = self.clock.t0.elapsed();
        // Stopped before its first token: all of it was prefill.
        let prefill = if self.last.is_none() {
            elapsed
        } else {
            self.clock.prefill
        };
        Generation {
            prompt_tokens: self.req.prompt.len(),
            tokens: std::mem::take(&mut self.out.tokens),
            text: std::mem::take(&mut self.out.text),
            stop,
            prefill,
            decode: elapsed.saturating_sub(prefill),
            spec: std::mem::take(&mut self.spec),
        }
    }
}

/// A prompt the context can take: not empty, shorter than the context.
pub(super) fn check_prompt(ctx: &Context, prompt: &[Token]) -> Result<(), GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let n_ctx = ctx.n_ctx();
    if prompt.len() >= n_ctx as usize {
        return Err(GenerateError::PromptTooLong {
            prompt_tokens: prompt.len(),
            n_ctx,
        });
    }
    Ok(())
}
