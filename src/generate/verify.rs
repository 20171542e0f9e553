//! One generation with its drafter, as `bmoe run` and `chat` start them: the
//! generation loop ([`Multi`]) over a context of one sequence. Each decode is
//! `[last, d1..dk]` (k = 0 without a draft), keeping the drafts the target's
//! own argmax confirms and trimming the rest from the KV cache.

use super::drafter::Drafter;
use super::error::GenerateError;
use super::multi::Multi;
use super::outcome::{DecodeStep, Generation, GenerationSink, Limit, Options};
use super::sequence::{check_prompt, Request};
use crate::llama::{Context, Target, Token};

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
/// The drafter borrows `target` for each of its calls. One generation in the
/// generation loop ([`Multi::step`], which serve drives with many).
pub fn generate_opts<'t>(
    target: &mut Target<'t>,
    prompt: &[Token],
    opts: &Options,
    sink: &mut dyn GenerationSink,
    drafter: Option<&mut dyn Drafter<'t>>,
) -> Result<Generation, GenerateError> {
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
    let n_batch = opts.n_batch.clamp(1, ctx.n_batch().max(1) as usize);
    let mut multi = Multi::new(1, n_batch);
    let cached = opts.cached.min(prompt.len() - 1);
    multi.set_held(0, prompt[..cached].to_vec(), 0);
    let req = Request {
        prompt: prompt.to_vec(),
        opts: opts.clone(),
        sink: Lent(sink),
        scope: 0,
    };
    multi.admit(ctx, req).map_err(|refused| refused.0)?;
    let mut drafters = [drafter];
    loop {
        let step = multi.step(target, &mut drafters)?;
        if let Some(f) = step.finished.into_iter().next() {
            return Ok(f.generation);
        }
        debug_assert!(
            multi.busy() == 1,
            "a generation that did not end is running"
        );
    }
}

/// The caller's sink, lent to the loop for one generation.
struct Lent<'s>(&'s mut dyn GenerationSink);

impl GenerationSink for Lent<'_> {
    fn text(&mut self, piece: &str) {
        self.0.text(piece)
    }

    fn decoded(&mut self, step: DecodeStep) {
        self.0.decoded(step)
    }

    fn next_token(&mut self) {
        self.0.next_token()
    }

    fn should_stop(&mut self) -> bool {
        self.0.should_stop()
    }
}
