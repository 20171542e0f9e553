//! Several generations decoded together (`bmoe serve --parallel N`): each in
//! a KV sequence of its own in one context, and one batch per step holding
//! every generating sequence's next token and as much of the waiting prompts
//! as fits, so one read of a routed expert serves every row that routed to it.

use std::time::{Duration, Instant};

use bmoe_decode::metrics::DecodeMetrics;

use super::emit::Emitter;
use super::error::GenerateError;
use super::outcome::{Generation, GenerationSink, Options, SpecStats, StopReason};
use super::picker::Picker;
use super::verify::check_prompt;
use crate::llama::{Batch, Context, LlamaError, Token};

/// One generation to run beside others (drafts are not used here).
pub(crate) struct Request<S> {
    pub(crate) prompt: Vec<Token>,
    pub(crate) opts: Options,
    pub(crate) sink: S,
    /// Who may reuse what it leaves in its sequence: a later request reuses
    /// a sequence's tokens only under the same scope (serve's tenants).
    pub(crate) scope: u64,
}

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
    slots: Vec<Slot<S>>,
    batch: Batch,
}

struct Slot<S> {
    seq: i32,
    /// The tokens whose KV entries the sequence holds, from position 0.
    kv: Vec<Token>,
    /// The scope of the request that left them ([`Request::scope`]).
    scope: u64,
    job: Option<Active<S>>,
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

/// A generation in progress.
struct Active<S> {
    req: Request<S>,
    picker: Picker,
    out: Emitter,
    reused: usize,
    /// The token to decode next (None while the prompt is still being fed).
    last: Option<Token>,
    t0: Instant,
    prefill: Duration,
    share: DecodeMetrics,
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
    /// when no sequence is free or the prompt does not fit.
    pub(crate) fn admit(&mut self, ctx: &mut Context, req: Request<S>) -> Result<(), Refused<S>> {
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
            req,
            picker,
            reused,
            last: None,
            t0: Instant::now(),
            prefill: Duration::ZERO,
            share: DecodeMetrics::default(),
        });
        Ok(())
    }

    /// One decode over every generating sequence: end those whose sink asks
    /// to stop or whose sequence is full, decode the rest's next tokens and
    /// the waiting prompts' next chunks, and hand out the picked tokens.
    /// After an error, [`Self::end_all`] ends the generations left.
    pub(crate) fn step(&mut self, ctx: &mut Context) -> Result<Step<S>, GenerateError> {
        let mut finished = self.end_stopped(ctx.n_ctx());
        let rows = self.fill_batch();
        // A batch of prompt rows alone (a long prompt's chunk before its
        // last) has no logits rows and is still decoded: skipped, its tokens
        // would be counted as held and never read (issue 67).
        if self.batch.is_empty() {
            return Ok(Step::idle(finished));
        }
        let t0 = Instant::now();
        let decoded = tracing::debug_span!("multi.decode", rows = rows.len())
            .in_scope(|| ctx.decode(&self.batch));
        match decoded {
            Err(LlamaError::Interrupted) => {
                finished.extend(self.end_all(ctx, StopReason::Interrupted));
                return Ok(Step::idle(finished));
            }
            r => r?,
        }
        let elapsed = t0.elapsed();
        let metrics = ctx.take_metrics();
        let sequences = self.charge(&metrics);
        finished.extend(self.pick_all(ctx, &rows)?);
        Ok(Step {
            finished,
            rows: rows.len(),
            sequences,
            elapsed,
            metrics,
        })
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

    /// End the generations whose sink asks to stop or whose sequence is full.
    fn end_stopped(&mut self, n_ctx: u32) -> Vec<Finished<S>> {
        let mut ended = Vec::new();
        for i in 0..self.slots.len() {
            let full = self.slots[i].kv.len() >= n_ctx as usize;
            let Some(a) = self.slots[i].job.as_mut() else {
                continue;
            };
            let stop = if a.req.sink.should_stop() {
                StopReason::Interrupted
            } else if full && a.last.is_some() {
                StopReason::ContextFull
            } else {
                continue;
            };
            ended.extend(self.end(i, stop));
        }
        ended
    }

    /// Fill the batch: each generating sequence's next token first (so a
    /// long prompt never stalls a reply), then waiting prompts while rows are
    /// left, the fewest tokens left first ([`prompt_order`]). For each row
    /// with logits, (batch row, slot).
    fn fill_batch(&mut self) -> Vec<(usize, usize)> {
        self.batch.clear();
        let mut rows = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(t) = slot.job.as_ref().and_then(|a| a.last) {
                rows.push((self.batch.len(), i));
                self.batch.push_seq(t, slot.kv.len() as i32, slot.seq, true);
                slot.kv.push(t);
            }
        }
        let left: Vec<Option<usize>> = self
            .slots
            .iter()
            .map(|s| {
                let a = s.job.as_ref().filter(|a| a.last.is_none())?;
                Some(a.req.prompt.len().saturating_sub(s.kv.len()))
            })
            .collect();
        for i in prompt_order(&left) {
            let slot = &mut self.slots[i];
            let Some(a) = slot.job.as_ref() else {
                continue;
            };
            let room = self.batch.capacity() - self.batch.len();
            let rest = &a.req.prompt[slot.kv.len()..];
            for (j, &t) in rest.iter().take(room).enumerate() {
                let last = j + 1 == rest.len();
                if last {
                    rows.push((self.batch.len(), i));
                }
                self.batch.push_seq(t, slot.kv.len() as i32, slot.seq, last);
                slot.kv.push(t);
            }
        }
        rows
    }

    /// Split the decode's streaming counters among the sequences by their
    /// rows in the batch; how many sequences had rows.
    fn charge(&mut self, m: &DecodeMetrics) -> usize {
        let n = self.batch.len() as u64;
        let mut per_seq = vec![0u64; self.slots.len()];
        for r in 0..self.batch.len() {
            if let Some(seq) = self.batch.seq(r) {
                per_seq[seq as usize] += 1;
            }
        }
        debug_assert_eq!(per_seq.iter().sum::<u64>(), n, "every row is in a sequence");
        for (slot, &rows) in self.slots.iter_mut().zip(&per_seq) {
            if let Some(a) = slot.job.as_mut() {
                let part = |x: u64| x * rows / n.max(1);
                a.share.read_bytes += part(m.read_bytes);
                a.share.hits += part(m.hits);
                a.share.misses += part(m.misses);
                a.share.stall += m.stall.mul_f64(rows as f64 / n.max(1) as f64);
            }
        }
        per_seq.iter().filter(|&&r| r > 0).count()
    }

    /// Pick each logits row's token and hand it to its generation; the
    /// generations that ended.
    fn pick_all(
        &mut self,
        ctx: &Context,
        rows: &[(usize, usize)],
    ) -> Result<Vec<Finished<S>>, GenerateError> {
        let model = ctx.model().clone();
        let mut ended = Vec::new();
        for &(row, i) in rows {
            let Some(a) = self.slots[i].job.as_mut() else {
                continue;
            };
            let t = a.picker.pick(ctx, row as i32)?;
            if a.last.is_none() {
                a.prefill = a.t0.elapsed();
            }
            a.last = Some(t);
            if let Some(stop) = a.out.token(&model, t, &mut a.req.sink) {
                ended.extend(self.end(i, stop));
            }
        }
        Ok(ended)
    }

    /// End slot `i`'s generation with `stop`.
    fn end(&mut self, i: usize, stop: StopReason) -> Option<Finished<S>> {
        let mut a = self.slots[i].job.take()?;
        a.out.finish(stop, &mut a.req.sink);
        let elapsed = a.t0.elapsed();
        let generation = Generation {
            prompt_tokens: a.req.prompt.len(),
            tokens: a.out.tokens,
            text: a.out.text,
            stop,
            prefill: a.prefill,
            decode: elapsed.saturating_sub(a.prefill),
            spec: SpecStats::default(),
        };
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
    fn idle(finished: Vec<Finished<S>>) -> Self {
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

/// The order waiting prompts take the batch's room in, from each slot's
/// prompt tokens left (None: no prompt waiting): the fewest first, ties in
/// slot order. A short turn beside a long prefill then gets its first token
/// in about its own time instead of after the other's whole prompt (issue
/// 67's agent replay measured the wait); the long one loses only the rows
/// of prompts shorter than its rest, which end, so it is never starved.
fn prompt_order(left: &[Option<usize>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..left.len()).filter(|&i| left[i].is_some()).collect();
    order.sort_by_key(|&i| (left[i], i));
    order
}

#[cfg(test)]
mod tests {
    use super::prompt_order;

    #[test]
    fn the_prompt_with_the_fewest_tokens_left_goes_first() {
        assert_eq!(prompt_order(&[Some(12_000), Some(800)]), [1, 0]);
        assert_eq!(prompt_order(&[Some(5), None, Some(5), Some(1)]), [3, 0, 2]);
        assert!(prompt_order(&[None, None]).is_empty());
    }
}
