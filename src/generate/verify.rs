//! The generation loop: prefill in micro-batches, then one decode per step of
//! `[last, d1..dk]` (k = 0 without a draft), keeping the drafts the target's own
//! argmax confirms and trimming the rest from the KV cache.

use std::time::{Duration, Instant};

use super::drafter::{Accepted, Drafter, Follow};
use super::emit::Emitter;
use super::error::GenerateError;
use super::outcome::{
    DecodeStep, GateStep, Generation, GenerationSink, Limit, Options, SpecStats, StopReason,
};
use super::picker::Picker;
use crate::llama::{Batch, Context, LlamaError, Model, Target, Token};

/// [`generate`](super::generate) with an optional drafter: each step drafts up
/// to `draft_max` tokens, decodes [last, d1..dN] in one batch with logits on
/// every row, keeps the longest prefix of drafts equal to the target's own
/// argmax plus the target's next token, and trims the rejected tail from the
/// KV cache. A step with no draft is exactly the plain single-token decode.
pub fn generate_with<'t>(
    ctx: &'t mut Context,
    prompt: &[Token],
    limit: impl Into<Limit>,
    n_batch: usize,
    sink: &mut dyn GenerationSink,
    drafter: Option<&mut dyn Drafter<'t>>,
    draft_max: usize,
) -> Result<Generation, GenerateError> {
    let opts = Options {
        limit: limit.into(),
        n_batch,
        draft_max,
        ..Options::default()
    };
    generate_opts(&mut Target::new(ctx), prompt, &opts, sink, drafter)
}

/// [`generate_with`] under [`Options`]: sampled or greedy, cut at stop
/// strings, after a prompt whose first `opts.cached` tokens are already in
/// the KV cache (the rest of the cache is dropped, only the new tokens are
/// prefilled). Drafts need greedy picks and a prompt prefilled from its start.
/// The drafter borrows `target` for each of its calls.
pub fn generate_opts<'t>(
    target: &mut Target<'t>,
    prompt: &[Token],
    opts: &Options,
    sink: &mut dyn GenerationSink,
    mut drafter: Option<&mut dyn Drafter<'t>>,
) -> Result<Generation, GenerateError> {
    let limit = opts.limit;
    let ctx = target.ctx()?;
    check_prompt(ctx, prompt)?;
    if let Some(d) = drafter.as_deref() {
        if !opts.sampling.is_greedy() || (opts.cached > 0 && d.follows_target()) {
            return Err(GenerateError::DraftNeedsGreedy);
        }
    }
    if drafter.is_some() && opts.grammar.is_some() {
        return Err(GenerateError::DraftWithGrammar);
    }
    let cached = reuse_prefix(ctx, prompt, opts.cached)?;
    let n_batch = opts.n_batch.clamp(1, ctx.n_batch().max(1) as usize);
    let mut batch = Batch::new(n_batch);
    let mut picker = Picker::new(
        ctx.model(),
        limit.ignore_eos,
        &opts.sampling,
        prompt,
        opts.grammar.as_ref(),
    )?;
    let model = ctx.model().clone();
    let t0 = Instant::now();
    let fresh = (&prompt[cached..], cached as i32);
    if !prefill(target, fresh, &mut batch, sink, drafter.as_deref_mut())? {
        return Ok(Generation::interrupted_in_prefill(
            prompt.len(),
            t0.elapsed(),
        ));
    }
    if let Some(d) = drafter.as_deref_mut() {
        d.follow(target, Follow::Begin(prompt))?;
    }
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let first = picker.pick(target.ctx()?, (batch.len() - 1) as i32)?;
    let draft_max = opts.draft_max;
    let mut run = Loop {
        n_ctx: target.ctx()?.n_ctx(),
        model,
        target,
        picker,
        batch,
        sink,
        drafter,
        draft_max,
        pos: prompt.len() as i32,
        out: Emitter::new(&opts.stop, limit, opts.special_text),
        corpus: prompt.to_vec(),
        spec: SpecStats::default(),
        catch_up: Duration::ZERO,
        decode_end: None,
        costs: (Duration::ZERO, Duration::ZERO),
    };
    let stop = run.until_stop(vec![first])?;
    Ok(run.finish(prompt.len(), stop, prefill_time, t1.elapsed()))
}

/// Keep the first `cached` prompt tokens' KV entries and drop the rest; at
/// least the last prompt token is decoded again (its logits start the
/// generation). How many were kept.
fn reuse_prefix(
    ctx: &mut Context,
    prompt: &[Token],
    cached: usize,
) -> Result<usize, GenerateError> {
    let cached = cached.min(prompt.len() - 1);
    if cached == 0 {
        ctx.clear();
    } else if !ctx.trim(cached as i32, -1) {
        return Err(GenerateError::Rollback { pos: cached as i32 });
    }
    Ok(cached)
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

impl Generation {
    /// A signal stopped the prefill: nothing was generated.
    fn interrupted_in_prefill(prompt_tokens: usize, prefill: Duration) -> Self {
        Self {
            prompt_tokens,
            tokens: Vec::new(),
            text: String::new(),
            stop: StopReason::Interrupted,
            prefill,
            decode: Duration::ZERO,
            spec: SpecStats::default(),
        }
    }
}

/// The state of one generation after its prefill.
struct Loop<'c, 't, 's, 'd> {
    target: &'c mut Target<'t>,
    /// The context's positions.
    n_ctx: u32,
    model: std::sync::Arc<Model>,
    picker: Picker,
    batch: Batch,
    sink: &'s mut dyn GenerationSink,
    drafter: Option<&'d mut dyn Drafter<'t>>,
    draft_max: usize,
    /// Where the next decoded token goes.
    pos: i32,
    /// Generated tokens and their text.
    out: Emitter,
    /// The prompt and every confirmed token (the drafters' corpus).
    corpus: Vec<Token>,
    spec: SpecStats,
    /// The drafter's catch-up on the previous verify step (drafting cost).
    catch_up: Duration,
    /// When the previous decode returned (the loop's overhead starts there).
    decode_end: Option<Instant>,
    /// The last verify decode's time and the drafting before it.
    costs: (Duration, Duration),
}

impl Loop<'_, '_, '_, '_> {
    /// Emit the tokens each decode determined and decode again until a stop.
    fn until_stop(&mut self, mut ready: Vec<Token>) -> Result<StopReason, GenerateError> {
        loop {
            if let Some(stop) = self.emit(ready) {
                return Ok(stop);
            }
            if self.pos as u32 >= self.n_ctx {
                return Ok(StopReason::ContextFull);
            }
            if self.sink.should_stop() {
                return Ok(StopReason::Interrupted);
            }
            match self.step()? {
                Some(r) => ready = r,
                None => return Ok(StopReason::Interrupted),
            }
        }
    }

    /// Hand the tokens one decode determined (in order) to the sink; a stop
    /// when one ends the text or reaches `-n`.
    fn emit(&mut self, ready: Vec<Token>) -> Option<StopReason> {
        for (i, t) in ready.into_iter().enumerate() {
            if i > 0 {
                self.sink.next_token();
            }
            let stop = self.out.token(&self.model, t, self.sink);
            if stop != Some(StopReason::EndOfText) {
                self.corpus.push(t);
            }
            if stop.is_some() {
                return stop;
            }
        }
        None
    }

    /// One verify step: draft, decode `[last, drafts..]`, keep what the target
    /// confirms. The kept tokens, or `None` when a signal stopped the decode.
    fn step(&mut self) -> Result<Option<Vec<Token>>, GenerateError> {
        let last = *self.out.tokens.last().ok_or(GenerateError::NoLogits)?;
        let tdraft = Instant::now();
        let (draft, gate) = self.draft()?;
        // Drafting cost of this step: the drafting call, plus the drafter's
        // catch-up on the previous verify step (the MTP head's own decode).
        let draft_time = tdraft.elapsed() + std::mem::take(&mut self.catch_up);
        self.batch.clear();
        self.batch.push(last, self.pos, true);
        for (i, &d) in draft.iter().enumerate() {
            self.batch.push(d, self.pos + 1 + i as i32, true);
        }
        let td = Instant::now();
        let loop_overhead = self
            .decode_end
            .map_or(Duration::ZERO, |e| (td - e).saturating_sub(draft_time));
        let (pos, rows) = (self.pos, self.batch.len());
        let ctx = self.target.ctx()?;
        let decoded = tracing::debug_span!("verify.decode", pos, rows, prefill = false)
            .in_scope(|| ctx.decode(&self.batch));
        if let Err(LlamaError::Interrupted) = decoded {
            return Ok(None);
        }
        decoded?;
        let elapsed = td.elapsed();
        self.decode_end = Some(td + elapsed);
        self.sink.decoded(DecodeStep {
            n_tokens: rows,
            prefill: false,
            elapsed,
            draft: draft_time,
            loop_overhead,
            gate,
            metrics: ctx.take_metrics(),
        });
        self.spec.loop_overhead += loop_overhead;
        self.costs = (elapsed, draft_time);
        self.spec.steps += 1;
        self.spec.draft += draft_time;
        let ready = self.accept(&draft)?;
        Ok(Some(ready))
    }

    /// Up to what still fits in `-n`, the context and the batch, after `last`;
    /// with the gate's decision when a gated drafter was asked this step (none
    /// when nothing fit: its last decision belongs to an earlier step).
    fn draft(&mut self) -> Result<(Vec<Token>, Option<GateStep>), GenerateError> {
        let room = self
            .draft_max
            .min(self.out.room() - 1)
            .min(self.n_ctx as usize - self.pos as usize - 1)
            .min(self.batch.capacity() - 1);
        let (pos, corpus, target) = (self.pos, &self.corpus, &mut *self.target);
        let (mut draft, gate) = match self.drafter.as_deref_mut() {
            Some(d) if room > 0 => {
                let draft = tracing::debug_span!("draft", source = d.name(), pos, max = room)
                    .in_scope(|| d.draft(target, corpus, room))?;
                (draft, d.gate_step())
            }
            _ => (Vec::new(), None),
        };
        draft.truncate(room);
        Ok((draft, gate))
    }

    /// Keep the longest prefix of `draft` equal to the target's argmax, then
    /// the target's own token after it; trim the rejected rows and let the
    /// drafter catch up on the kept ones.
    fn accept(&mut self, draft: &[Token]) -> Result<Vec<Token>, GenerateError> {
        let mut ready = Vec::with_capacity(draft.len() + 1);
        let mut accepted = 0usize;
        let ctx = self.target.ctx()?;
        loop {
            let t = self.picker.pick(ctx, accepted as i32)?;
            ready.push(t);
            if accepted < draft.len() && draft[accepted] == t {
                accepted += 1;
            } else {
                break;
            }
        }
        debug_assert!(
            self.picker.sampler.is_some()
                || ready
                    .iter()
                    .enumerate()
                    .all(|(i, &t)| self.picker.pick(ctx, i as i32).ok() == Some(t)),
            "every kept token is the argmax of the verify row that produced it"
        );
        self.pos += 1 + accepted as i32;
        if !draft.is_empty() {
            self.spec.drafted_steps += 1;
            self.spec.drafted += draft.len() as u64;
            self.spec.accepted += accepted as u64;
            if accepted < draft.len() && !ctx.trim(self.pos, -1) {
                return Err(GenerateError::Rollback { pos: self.pos });
            }
        }
        if let Some(d) = self.drafter.as_deref_mut() {
            // The drafter catches up on the kept rows only ([last, d1..dk]), so it
            // never holds a rejected tail to drop.
            let tc = Instant::now();
            self.batch.truncate(1 + accepted);
            d.follow(self.target, Follow::Decoded(&self.batch))?;
            let step = Accepted {
                drafted: draft.len(),
                accepted,
                n_past: self.pos,
                verify: self.costs.0,
                draft: self.costs.1,
            };
            d.follow(self.target, Follow::Accepted(step))?;
            self.catch_up = tc.elapsed();
        }
        Ok(ready)
    }

    /// The generation as it ended: the last catch-up is drafting cost too, and
    /// any incomplete UTF-8 tail is flushed.
    fn finish(
        mut self,
        prompt_tokens: usize,
        stop: StopReason,
        prefill: Duration,
        decode: Duration,
    ) -> Generation {
        self.spec.draft += self.catch_up;
        self.out.finish(stop, self.sink);
        Generation {
            prompt_tokens,
            tokens: self.out.tokens,
            text: self.out.text,
            stop,
            prefill,
            decode,
            spec: self.spec,
        }
    }
}

/// Decode the prompt in batches of `batch`'s capacity, logits on its last
/// row only. Returns false when a signal or a failed output stopped it
/// (between batches, or inside one through the context's abort callback).
fn prefill<'t, 'd>(
    target: &mut Target<'t>,
    (prompt, mut pos): (&[Token], i32),
    batch: &mut Batch,
    sink: &mut dyn GenerationSink,
    mut drafter: Option<&mut (dyn Drafter<'t> + 'd)>,
) -> Result<bool, GenerateError> {
    let n_batch = batch.capacity();
    for (ci, chunk) in prompt.chunks(n_batch).enumerate() {
        if sink.should_stop() {
            return Ok(false);
        }
        batch.clear();
        let last_chunk = (ci + 1) * n_batch >= prompt.len();
        for (i, &t) in chunk.iter().enumerate() {
            batch.push(t, pos, last_chunk && i + 1 == chunk.len());
            pos += 1;
        }
        let td = Instant::now();
        let ctx = target.ctx()?;
        let decoded =
            tracing::debug_span!("verify.decode", pos, rows = batch.len(), prefill = true)
                .in_scope(|| ctx.decode(batch));
        match decoded {
            Err(LlamaError::Interrupted) => return Ok(false),
            r => r?,
        }
        sink.decoded(DecodeStep {
            n_tokens: batch.len(),
            prefill: true,
            elapsed: td.elapsed(),
            draft: Duration::ZERO,
            loop_overhead: Duration::ZERO,
            gate: None,
            metrics: ctx.take_metrics(),
        });
        if let Some(d) = drafter.as_deref_mut() {
            d.follow(target, Follow::Decoded(batch))?;
        }
    }
    Ok(true)
}
