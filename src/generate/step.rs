//! One step of the generation loop ([`Multi::step`]): the one function that
//! drives generation for `bmoe run`, `chat` and `serve` (the architecture
//! test holds it to that). Drafts first, then one batch (each generating
//! sequence's `[last, d1..dk]`, then the waiting prompts' chunks), one
//! decode, and what each sequence keeps.

use std::time::{Duration, Instant};

use bmoe_decode::metrics::DecodeMetrics;

use super::drafter::Follow;
use super::error::GenerateError;
use super::multi::{Drafters, Finished, Multi, Step};
use super::outcome::{DecodeStep, GenerationSink, StopReason};
use crate::llama::{LlamaError, Target};

/// One sequence's rows in the batch: from `base`, `n` of them; `prompt`
/// when they are a chunk of its prompt, `picks` when a token is picked from
/// them (every verify step; a prompt's last chunk).
#[derive(Debug, Clone, Copy)]
struct Rows {
    slot: usize,
    base: usize,
    n: usize,
    prompt: bool,
    picks: bool,
}

impl<S: GenerationSink> Multi<S> {
    /// One decode over every generating sequence: end those whose sequence
    /// is full or whose sink asks to stop, draft for the rest, decode their
    /// next tokens and drafts and the waiting prompts' next chunks, and hand
    /// out the tokens each kept. `drafters` are by sequence. After an error,
    /// [`Self::end_all`] ends the generations left.
    pub(crate) fn step<'t>(
        &mut self,
        target: &mut Target<'t>,
        drafters: &mut Drafters<'_, 't>,
    ) -> Result<Step<S>, GenerateError> {
        let n_ctx = target.ctx()?.n_ctx();
        let mut finished = self.end_stopped(n_ctx);
        self.draft_all(target, drafters, n_ctx as usize)?;
        let held: Vec<usize> = self.slots.iter().map(|s| s.kv.len()).collect();
        let rows = self.fill_batch();
        // A batch of prompt rows alone (a long prompt's chunk before its
        // last) has no logits rows and is still decoded: skipped, its tokens
        // would be counted as held and never read (issue 67).
        if self.batch.is_empty() {
            return Ok(Step::idle(finished));
        }
        let ctx = target.ctx()?;
        let t0 = Instant::now();
        // The batch's first position (one sequence's: its own), and whether
        // every row is a prompt's.
        let pos = self.batch.get(0).map_or(0, |(_, p, _)| p);
        let prefill = rows.iter().all(|r| r.prompt);
        let (n, sequences) = (self.batch.len(), rows.len());
        let decoded = tracing::debug_span!("verify.decode", pos, rows = n, prefill, sequences)
            .in_scope(|| ctx.decode(&self.batch));
        match decoded {
            Err(LlamaError::Interrupted) => {
                finished.extend(self.interrupted(target, &held)?);
                return Ok(Step::idle(finished));
            }
            r => r?,
        }
        let elapsed = t0.elapsed();
        let metrics = ctx.take_metrics();
        self.report(&metrics, &rows, (t0, elapsed));
        finished.extend(self.pick_all(target, drafters, &rows)?);
        Ok(Step {
            finished,
            rows: self.batch.len(),
            sequences: rows.len(),
            elapsed,
            metrics,
        })
    }

    /// End the generations whose sequence is full or whose sink asks to stop.
    fn end_stopped(&mut self, n_ctx: u32) -> Vec<Finished<S>> {
        let mut ended = Vec::new();
        for i in 0..self.slots.len() {
            let full = self.slots[i].kv.len() >= n_ctx as usize;
            let Some(a) = self.slots[i].job.as_mut() else {
                continue;
            };
            let stop = if full && a.last.is_some() {
                StopReason::ContextFull
            } else if a.req.sink.should_stop() {
                StopReason::Interrupted
            } else {
                continue;
            };
            ended.extend(self.end(i, stop));
        }
        ended
    }

    /// Each generating sequence's drafts, within what its context and the
    /// batch leave (every generating sequence keeps a row for its next token).
    fn draft_all<'t>(
        &mut self,
        target: &mut Target<'t>,
        drafters: &mut Drafters<'_, 't>,
        n_ctx: usize,
    ) -> Result<(), GenerateError> {
        let generating = self
            .slots
            .iter()
            .filter(|s| s.job.as_ref().is_some_and(|a| a.last.is_some()))
            .count();
        let mut free = self.batch.capacity().saturating_sub(generating);
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = slot.job.as_mut().filter(|a| a.last.is_some()) else {
                continue;
            };
            let room = free.min(n_ctx.saturating_sub(slot.kv.len() + 1));
            let drafter = drafters.get_mut(i).and_then(|d| d.as_deref_mut());
            a.draft(target, drafter, room)?;
            free -= a.draft.len();
        }
        Ok(())
    }

    /// Fill the batch: each generating sequence's next token and drafts
    /// first (so a long prompt never stalls a reply), then waiting prompts
    /// while rows are left, the fewest tokens left first ([`prompt_order`]).
    fn fill_batch(&mut self) -> Vec<Rows> {
        self.batch.clear();
        let mut rows = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = slot.job.as_ref() else {
                continue;
            };
            let Some(last) = a.last else {
                continue;
            };
            let base = self.batch.len();
            for &t in std::iter::once(&last).chain(&a.draft) {
                self.batch.push_seq(t, slot.kv.len() as i32, slot.seq, true);
                slot.kv.push(t);
            }
            let n = self.batch.len() - base;
            rows.push(Rows {
                slot: i,
                base,
                n,
                prompt: false,
                picks: true,
            });
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
            let (base, room) = (self.batch.len(), self.batch.capacity() - self.batch.len());
            let rest = &a.req.prompt[slot.kv.len()..];
            let n = rest.len().min(room);
            for (j, &t) in rest[..n].iter().enumerate() {
                let last = j + 1 == rest.len();
                self.batch.push_seq(t, slot.kv.len() as i32, slot.seq, last);
                slot.kv.push(t);
            }
            if n > 0 {
                let picks = n == rest.len();
                rows.push(Rows {
                    slot: i,
                    base,
                    n,
                    prompt: true,
                    picks,
                });
            }
        }
        rows
    }

    /// Each sequence in the decode gets its share of the streaming counters
    /// (by its rows; the whole decode's when it was alone in the batch) and
    /// its sink the decode's [`DecodeStep`].
    fn report(&mut self, m: &DecodeMetrics, rows: &[Rows], (start, elapsed): (Instant, Duration)) {
        let n = self.batch.len() as u64;
        debug_assert_eq!(
            rows.iter().map(|r| r.n as u64).sum::<u64>(),
            n,
            "every row is in a sequence"
        );
        debug_assert!(
            rows.iter().all(|r| (r.base..r.base + r.n)
                .all(|i| self.batch.seq(i) == Some(self.slots[r.slot].seq))),
            "a sequence's rows are its own"
        );
        let alone = rows.len() == 1;
        for r in rows {
            let Some(a) = self.slots[r.slot].job.as_mut() else {
                continue;
            };
            let part = split(m, r.n as u64, n);
            a.share.add(part.clone());
            let verify = !r.prompt;
            let loop_overhead = if verify {
                a.clock.overhead(start)
            } else {
                Duration::ZERO
            };
            if verify {
                a.spec.loop_overhead += loop_overhead;
                a.clock.verified(start, elapsed);
            }
            a.req.sink.decoded(DecodeStep {
                n_tokens: r.n,
                prefill: r.prompt,
                elapsed,
                draft: if verify {
                    a.clock.draft
                } else {
                    Duration::ZERO
                },
                loop_overhead,
                gate: if verify { a.clock.gate.take() } else { None },
                metrics: if alone { m.clone() } else { part },
            });
        }
    }

    /// Pick each sequence's tokens from its rows, let its drafter follow, and
    /// hand them to its generation; the generations that ended.
    fn pick_all<'t>(
        &mut self,
        target: &mut Target<'t>,
        drafters: &mut Drafters<'_, 't>,
        rows: &[Rows],
    ) -> Result<Vec<Finished<S>>, GenerateError> {
        let model = target.ctx()?.model().clone();
        let alone = rows.len() == 1;
        let mut ended = Vec::new();
        for r in rows {
            let mut drafter = drafters.get_mut(r.slot).and_then(|d| d.as_deref_mut());
            // The head reads the target's rows of its own sequence alone.
            let follows = drafter.as_ref().is_some_and(|d| d.follows_target());
            if follows && !alone {
                return Err(GenerateError::DraftNeedsOneSequence);
            }
            let slot = &mut self.slots[r.slot];
            let Some(a) = slot.job.as_mut() else {
                continue;
            };
            let ready = if r.prompt {
                if let Some(d) = drafter.as_deref_mut().filter(|_| follows) {
                    d.follow(target, Follow::Decoded(&self.batch))?;
                }
                if !r.picks {
                    continue;
                }
                if let Some(d) = drafter {
                    d.follow(target, Follow::Begin(&a.req.prompt))?;
                }
                a.clock.prefill = a.clock.t0.elapsed();
                vec![a.picker.pick(target.ctx()?, (r.base + r.n - 1) as i32)?]
            } else {
                let drafted = a.draft.len();
                let ready = a.accept(target.ctx()?, (slot.seq, r.base), &mut slot.kv)?;
                if let Some(d) = drafter {
                    let kept = (drafted, ready.len() - 1, slot.kv.len());
                    a.follow_kept(target, d, &mut self.batch, kept)?;
                }
                ready
            };
            if let Some(stop) = a.emit(&model, ready) {
                ended.extend(self.end(r.slot, stop));
            }
        }
        Ok(ended)
    }

    /// A signal stopped the decode: every generation ends (interrupted) and
    /// the sequences drop this batch's rows, keeping what they held before it.
    fn interrupted(
        &mut self,
        target: &mut Target<'_>,
        held: &[usize],
    ) -> Result<Vec<Finished<S>>, GenerateError> {
        let ctx = target.ctx()?;
        for (slot, &n) in self.slots.iter_mut().zip(held) {
            slot.kv.truncate(n);
            if !ctx.trim_seq(slot.seq, n as i32, -1) {
                ctx.clear();
                self.slots.iter_mut().for_each(|s| s.kv.clear());
                break;
            }
        }
        Ok((0..self.slots.len())
            .filter_map(|i| self.end(i, StopReason::Interrupted))
            .collect())
    }
}

/// A sequence's part of a decode's streaming counters: flash bytes, cache
/// hits and misses and stall by its `rows` of the batch's `n` (the other
/// counters stay zero).
fn split(m: &DecodeMetrics, rows: u64, n: u64) -> DecodeMetrics {
    let part = |x: u64| x * rows / n.max(1);
    DecodeMetrics {
        read_bytes: part(m.read_bytes),
        hits: part(m.hits),
        misses: part(m.misses),
        stall: m.stall.mul_f64(rows as f64 / n.max(1) as f64),
        ..DecodeMetrics::default()
    }
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
