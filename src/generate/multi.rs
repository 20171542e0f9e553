//! The generation loop: every generation of one context (`bmoe run` and
//! `chat` start one at a time, `bmoe serve --parallel N` up to N), each in a
//! KV sequence of its own, and one batch per step holding every generating
//! sequence's next token and drafts and as much of the waiting prompts as
//! fits, so one read of a routed expert serves every row that routed to it.
//! One generation's own part of a step (drafts, what is kept) is in
//! `sequence`.

use std::time::Duration;

use bmoe_decode::metrics::DecodeMetrics;

use super::drafter::Drafter;
use super::emit::Emitter;
use super::error::GenerateError;
use super::outcome::{Generation, GenerationSink, StopReason};
use super::picker::Picker;
use super::sequence::{check_prompt, Active, Clock, Request};
use crate::llama::{Batch, Context, Token};

/// The drafters of a step's generations, by sequence (a missing or `None`
/// entry: that sequence does not draft). A drafter that follows the target
/// (the MTP head, the gate) needs its sequence alone in the batch.
pub(crate) type Drafters<'a, 't> = [Option<&'a mut dyn Drafter<'t>>];

/// A request [`Multi::admit`] could not start, with why (boxed: a request
/// carries its prompt and options).
pub(crate) type Refused<S> = Box<(GenerateError, Request<S>)>;

/// A generation that ended, with its sink back.
pub(crate) struct Finished<S> {
    pub(crate) sink: S,
    /// The KV sequence it ran in (see [`Multi::held`]).
    pub(crate) seq: i32,
    pub(crate) generation: Generation,
    /// Prompt tokens whose KV entries an earlier generation in the same
    /// sequence left (they were not decoded again).
    pub(crate) reused: usize,
    /// Its share of the decodes it took part in: each decode's flash bytes,
    /// cache hits and misses and stall split by the rows each sequence had
    /// in it (the other counters stay zero).
    pub(crate) share: DecodeMetrics,
}

/// What one step decoded, and the generations it ended.
pub(crate) struct Step<S> {
    pub(crate) finished: Vec<Finished<S>>,
    /// Rows in the batch (0: nothing was left to decode).
    pub(crate) rows: usize,
    /// Sequences with a row in it.
    pub(crate) sequences: usize,
    pub(crate) elapsed: Duration,
    /// The decode's streaming counters (zeros when resident).
    pub(crate) metrics: DecodeMetrics,
}

/// The sequences of one context and the generations running in them.
pub(crate) struct Multi<S> {
    pub(super) slots: Vec<Slot<S>>,
    pub(super) batch: Batch,
}

pub(super) struct Slot<S> {
    pub(super) seq: i32,
    /// The tokens whose KV entries the sequence holds, from position 0.
    pub(super) kv: Vec<Token>,
    /// The scope of the request that left them ([`Request::scope`]).
    scope: u64,
    pub(super) job: Option<Active<S>>,
}

impl<S> Slot<S> {
    /// How many of `prompt`'s first tokens a request of `scope` may reuse
    /// from this sequence (none of another scope's).
    fn reusable(&self, prompt: &[Token], scope: u64) -> usize {
        if self.scope == scope {
            common_prefix(&self.kv, prompt)
        } else {
            0
        }
    }
}

impl<S: GenerationSink> Multi<S> {
    /// `n_seq` sequences (the context's), batches of up to `n_batch` rows.
    pub(crate) fn new(n_seq: usize, n_batch: usize) -> Self {
        let slots = (0..n_seq.max(1))
            .map(|i| Slot {
                seq: i as i32,
                kv: Vec::new(),
                scope: 0,
                job: None,
            })
            .collect();
        Self {
            slots,
            batch: Batch::new(n_batch),
        }
    }

    /// Sequences with no generation in them.
    pub(crate) fn free(&self) -> usize {
        self.slots.iter().filter(|s| s.job.is_none()).count()
    }

    /// Sequences generating.
    pub(crate) fn busy(&self) -> usize {
        self.slots.len() - self.free()
    }

    /// The free sequence [`Self::admit`] would start `prompt` in, and how
    /// many of its first tokens it holds (None: no sequence is free).
    pub(crate) fn target(&self, prompt: &[Token], scope: u64) -> Option<(i32, usize)> {
        self.slots
            .iter()
            .filter(|s| s.job.is_none())
            .map(|s| (s.seq, s.reusable(prompt, scope)))
            .max_by_key(|&(_, c)| c)
    }

    /// The scope of what sequence `seq` holds.
    pub(crate) fn scope(&self, seq: i32) -> u64 {
        self.slots.get(seq as usize).map_or(0, |s| s.scope)
    }

    /// The tokens whose KV entries sequence `seq` holds.
    pub(crate) fn held(&self, seq: i32) -> &[Token] {
        self.slots.get(seq as usize).map_or(&[], |s| &s.kv)
    }

    /// Say that free sequence `seq` now holds `tokens` (its state was put
    /// back from the prompt cache; empty after a failed restore).
    pub(crate) fn set_held(&mut self, seq: i32, tokens: Vec<Token>, scope: u64) {
        let slot = self.slots.get_mut(seq as usize);
        debug_assert!(slot.as_ref().is_some_and(|s| s.job.is_none()));
        if let Some(s) = slot.filter(|s| s.job.is_none()) {
            s.kv = tokens;
            s.scope = scope;
        }
    }

    /// Start `req` in the free sequence whose KV cache shares the longest
    /// prefix with its prompt (only the rest is prefilled). The request back
    /// when no sequence is free or the prompt does not fit; else the sequence
    /// it runs in (its drafter goes at that index of [`Drafters`]).
    pub(crate) fn admit(&mut self, ctx: &mut Context, req: Request<S>) -> Result<i32, Refused<S>> {
        if let Err(e) = check_prompt(ctx, &req.prompt) {
            return Err(Box::new((e, req)));
        }
        let best = self
            .slots
            .iter_mut()
            .filter(|s| s.job.is_none())
            .max_by_key(|s| s.reusable(&req.prompt, req.scope));
        let Some(slot) = best else {
            return Err(Box::new((GenerateError::NoFreeSequence, req)));
        };
        let reused = slot
            .reusable(&req.prompt, req.scope)
            .min(req.prompt.len() - 1);
        if !ctx.trim_seq(slot.seq, reused as i32, -1) {
            return Err(Box::new((
                GenerateError::Rollback { pos: reused as i32 },
                req,
            )));
        }
        slot.kv.truncate(reused);
        slot.scope = req.scope;
        let opts = &req.opts;
        let picker = match Picker::new(
            ctx.model(),
            opts.limit.ignore_eos,
            &opts.sampling,
            &req.prompt,
            opts.grammar.as_ref(),
        ) {
            Ok(p) => p,
            Err(e) => return Err(Box::new((e, req))),
        };
        slot.job = Some(Active {
            out: Emitter::new(&opts.stop, opts.limit, opts.special_text),
            corpus: req.prompt.clone(),
            req,
            picker,
            reused,
            last: None,
            draft: Vec::new(),
            spec: Default::default(),
            clock: Clock::new(),
            share: DecodeMetrics::default(),
        });
        Ok(slot.seq)
    }

    /// End every generation (after a failed decode, or at shutdown) and
    /// forget what the sequences hold; the sinks back.
    pub(crate) fn end_all(&mut self, ctx: &mut Context, stop: StopReason) -> Vec<Finished<S>> {
        ctx.clear();
        self.slots.iter_mut().for_each(|s| s.kv.clear());
        (0..self.slots.len())
            .filter_map(|i| self.end(i, stop))
            .collect()
    }

    /// End slot `i`'s generation with `stop`.
    pub(super) fn end(&mut self, i: usize, stop: StopReason) -> Option<Finished<S>> {
        let mut a = self.slots[i].job.take()?;
        let generation = a.finish(stop);
        Some(Finished {
            sink: a.req.sink,
            seq: self.slots[i].seq,
            generation,
            reused: a.reused,
            share: a.share,
        })
    }
}

impl<S> Step<S> {
    pub(super) fn idle(finished: Vec<Finished<S>>) -> Self {
        Self {
            finished,
            rows: 0,
            sequences: 0,
            elapsed: Duration::ZERO,
            metrics: DecodeMetrics::default(),
        }
    }
}

/// The length of the longest common prefix.
pub(crate) fn common_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
