//! The speculation gate around a draft source (`--spec`): before each verify
//! step it asks the pure [`Gate`] how many of the source's drafts are worth
//! verifying on this host now, and after the step it tells the gate what the
//! step cost and kept. The loop itself is unchanged: a gated source is one
//! more [`Drafter`]. With `--spec auto` it asks the n-gram matcher first
//! (a lookup, nearly free) and the MTP head only when the matcher has no
//! match; the head still sees every decoded batch, and on a step the matcher
//! drafted it is told it drafted nothing (it only trims its own positions).
//! A head the gate keeps holding back rests (`spec_gate::upkeep`): it forgets
//! its cache and skips its catch-up until the gate would let it draft again.

use bmoe_decode::spec_gate::upkeep::{HeadStep, Upkeep};
use bmoe_decode::spec_gate::{self, Choice, Gate, HeldBack, Source, StepCost};

use super::drafter::{Accepted, Drafted, Drafter, Follow, NgramDrafter};
use super::error::GenerateError;
use super::outcome::{GateStats, GateStep};
use crate::llama::{Target, Token};

/// Where a gated step's drafts come from.
pub enum Sources<'d, 't> {
    /// One source (`--spec ngram|mtp`).
    One(&'d mut dyn Drafter<'t>, Source),
    /// `--spec auto` with a head: the matcher when it matches, else the head.
    Auto {
        ngram: &'d mut NgramDrafter,
        head: &'d mut dyn Drafter<'t>,
    },
}

impl GateStats {
    fn count_upkeep(&mut self, step: HeadStep) {
        match step {
            HeadStep::Rest { .. } => self.rested += 1,
            HeadStep::Wake => self.woke += 1,
            HeadStep::Draft(_) | HeadStep::Hold => {}
        }
    }
}

/// A draft source behind the gate.
pub struct GatedDrafter<'d, 't> {
    sources: Sources<'d, 't>,
    gate: Gate,
    /// The source of the last step's draft, its buckets (one per verified
    /// draft) and the decision.
    source: Source,
    buckets: Vec<usize>,
    last: Option<GateStep>,
    /// How long the last step's drafting call took (the source's own).
    draft_call: std::time::Duration,
    /// The matcher's first draft token the gate cut, to judge by the token
    /// the target produces in its place.
    unverified: Option<Unverified>,
    /// The first bucket the head reported last time (a prior for capping it
    /// before it drafts).
    last_bucket: usize,
    /// Whether the head keeps up with the target while held back.
    upkeep: Upkeep,
    pub stats: GateStats,
}

/// A draft token not verified: the corpus index it would have filled, its
/// position in the draft, its bucket and the token.
#[derive(Debug, Clone, Copy)]
struct Unverified {
    at: usize,
    position: usize,
    bucket: usize,
    token: Token,
}

/// What a source drafted for one step: the source, how far it was allowed
/// (`max` unless capped before drafting), its drafts and their evidence.
struct Asked {
    source: Source,
    cap: usize,
    draft: Vec<Token>,
    evidence: Vec<f32>,
}

impl<'d, 't> GatedDrafter<'d, 't> {
    pub fn new(sources: Sources<'d, 't>, max_draft: usize) -> Self {
        let source = match &sources {
            Sources::One(_, s) => *s,
            Sources::Auto { .. } => Source::Ngram,
        };
        Self {
            sources,
            gate: Gate::new(max_draft),
            source,
            buckets: Vec::new(),
            last: None,
            draft_call: std::time::Duration::ZERO,
            unverified: None,
            last_bucket: 0,
            upkeep: Upkeep::default(),
            stats: GateStats::default(),
        }
    }

    /// How far a source may draft at all this step: an expensive one (the
    /// MTP head, a pass per token) is capped before it drafts; a cheap one
    /// (n-gram) drafts all it can and is cut after.
    fn cap(gate: &Gate, source: Source, last_bucket: usize, max: usize) -> usize {
        match source {
            Source::Ngram => max,
            Source::Mtp => gate.choose(source, &vec![last_bucket; max]).k,
        }
    }

    /// Ask the step's source for up to `max` drafts.
    fn ask(
        &mut self,
        target: &mut Target<'t>,
        corpus: &[Token],
        max: usize,
    ) -> Result<Asked, GenerateError> {
        let (inner, source): (&mut dyn Drafter<'t>, Source) = match &mut self.sources {
            Sources::One(d, s) => (&mut **d, *s),
            Sources::Auto { ngram, head } => {
                let draft = ngram.draft(target, corpus, max)?;
                if !draft.is_empty() {
                    let evidence = ngram.evidence();
                    let source = Source::Ngram;
                    return Ok(Asked {
                        source,
                        cap: max,
                        draft,
                        evidence,
                    });
                }
                (&mut **head, Source::Mtp)
            }
        };
        let cap = Self::cap(&self.gate, source, self.last_bucket, max);
        let cap = match source {
            Source::Ngram => cap,
            Source::Mtp => {
                let step = self.upkeep.step(cap);
                self.stats.count_upkeep(step);
                if step == (HeadStep::Rest { forget: true }) {
                    inner.follow(target, Follow::Forget)?;
                }
                step.cap()
            }
        };
        let draft = match cap {
            0 => Vec::new(),
            n => inner.draft(target, corpus, n)?,
        };
        let evidence = inner.evidence();
        Ok(Asked {
            source,
            cap,
            draft,
            evidence,
        })
    }

    /// The source that follows the target's cache (the head in `auto`; the
    /// matcher needs no telling): it is told of every decode and step.
    fn follower(&mut self) -> &mut dyn Drafter<'t> {
        match &mut self.sources {
            Sources::One(d, _) => &mut **d,
            Sources::Auto { head, .. } => &mut **head,
        }
    }

    /// Judge the matcher's last cut draft token by the token the target
    /// produced in its place (now in `corpus`), if it did.
    fn judge_unverified(&mut self, corpus: &[Token]) {
        let Some(u) = self.unverified.take() else {
            return;
        };
        if let Some(&t) = corpus.get(u.at) {
            let kept = t == u.token;
            (self.gate).observe_unverified(Source::Ngram, u.position, u.bucket, kept);
        }
    }

    /// Tell the gate what the step cost and kept; the step as the follower
    /// sees it (in `auto` the head keeps what the target kept, having seen
    /// the decoded rows: the matcher's draft is nothing for it to accept).
    fn observe(&mut self, step: Accepted) -> Accepted {
        let cost = StepCost {
            verify_s: step.verify.as_secs_f64(),
            draft_s: self.draft_call.as_secs_f64(),
        };
        let buckets = std::mem::take(&mut self.buckets);
        if step.accepted < step.drafted {
            // A verified draft was rejected: the cut one is judged by nothing.
            self.unverified = None;
        }
        debug_assert_eq!(
            buckets.len(),
            step.drafted,
            "the loop verified what the gate chose"
        );
        self.gate
            .observe(self.source, &buckets, step.accepted, cost);
        let matcher_drafted_for_head =
            matches!(self.sources, Sources::Auto { .. }) && self.source == Source::Ngram;
        match matcher_drafted_for_head {
            true => Accepted {
                drafted: 0,
                accepted: 0,
                ..step
            },
            false => step,
        }
    }

    fn count(&mut self, available: usize, c: &Choice) {
        let s = &mut self.stats;
        s.steps += 1;
        s.explored += u64::from(c.explore);
        if c.k > 0 {
            s.drafted_steps += 1;
            s.drafted += c.k as u64;
            s.drafted_steps_by[self.source as usize] += 1;
        }
        match c.held_back {
            Some(HeldBack::NoDraft) => s.no_draft += 1,
            Some(HeldBack::NotWorthIt) if available > 0 => {
                s.shortened += 1;
                s.held_to_plain += u64::from(c.k == 0);
            }
            _ => {}
        }
    }
}

impl<'t> Drafter<'t> for GatedDrafter<'_, 't> {
    fn name(&self) -> &'static str {
        match &self.sources {
            Sources::One(d, _) => d.name(),
            Sources::Auto { .. } => "auto",
        }
    }

    fn draft(&mut self, target: &mut Target<'t>, corpus: &[Token], max: usize) -> Drafted {
        self.judge_unverified(corpus);
        let t = std::time::Instant::now();
        let Asked {
            source,
            cap,
            mut draft,
            evidence,
        } = self.ask(target, corpus, max)?;
        self.draft_call = t.elapsed();
        self.source = source;
        let buckets: Vec<usize> = (0..draft.len())
            .map(|i| {
                let e = evidence.get(i).copied().unwrap_or(0.0);
                spec_gate::bucket(source, e)
            })
            .collect();
        if let (Source::Mtp, Some(&b)) = (source, buckets.first()) {
            self.last_bucket = b;
        }
        let mut choice = self.gate.choose(source, &buckets);
        // Capped before drafting: the source was held back from up to `max`.
        let available = if cap == 0 { max } else { draft.len() };
        if cap < max && (cap == 0 || choice.held_back.is_none()) {
            choice.held_back = Some(HeldBack::NotWorthIt);
        }
        if source == Source::Ngram && draft.len() > choice.k {
            self.unverified = Some(Unverified {
                at: corpus.len() + choice.k,
                position: choice.k,
                bucket: buckets[choice.k],
                token: draft[choice.k],
            });
        }
        draft.truncate(choice.k);
        self.buckets = buckets[..draft.len()].to_vec();
        self.count(available, &choice);
        self.last = Some(GateStep {
            source,
            available,
            choice,
        });
        Ok(draft)
    }

    /// The follower hears of the target's cache, except while it rests (its
    /// cache is empty: nothing to catch up, keep or trim); the gate learns
    /// what each step cost and kept.
    fn follow(&mut self, target: &mut Target<'t>, event: Follow<'_>) -> Result<(), GenerateError> {
        let event = match event {
            Follow::Accepted(step) => Follow::Accepted(self.observe(step)),
            Follow::Forget => return Ok(()),
            e => e,
        };
        match event {
            Follow::Begin(_) => self.follower().follow(target, event),
            _ if self.upkeep.resting() => Ok(()),
            _ => self.follower().follow(target, event),
        }
    }

    fn gate_step(&self) -> Option<GateStep> {
        self.last
    }
}
