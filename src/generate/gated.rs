//! The speculation gate around a draft source (`--spec`): before each verify
//! step it asks the pure [`Gate`] how many of the source's drafts are worth
//! verifying on this host now, and after the step it tells the gate what the
//! step cost and kept. The loop itself is unchanged: a gated source is one
//! more [`Drafter`].

use bmoe_actors::spec_gate::{self, Choice, Gate, HeldBack, Source, StepCost};

use super::{Accepted, Drafter, GenerateError};
use crate::llama::{Batch, Context, Token};

/// What the gate decided on one step, for the telemetry row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateStep {
    /// Drafts the source had.
    pub available: usize,
    pub choice: Choice,
}

/// The gate's decisions over a run (the summary's `spec-gate:` line).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GateStats {
    pub steps: u64,
    /// Steps that verified at least one draft, and the drafts they verified.
    pub drafted_steps: u64,
    pub drafted: u64,
    /// Steps whose source had nothing to draft.
    pub no_draft: u64,
    /// Steps that verified fewer drafts than the source had, and of them the
    /// ones that verified none.
    pub shortened: u64,
    pub held_to_plain: u64,
    /// One-token drafts taken against the estimates to refresh them.
    pub explored: u64,
}

/// A draft source behind the gate.
pub struct GatedDrafter<'d> {
    inner: &'d mut dyn Drafter,
    source: Source,
    gate: Gate,
    /// The last step's draft buckets (one per verified draft) and decision.
    buckets: Vec<usize>,
    last: Option<GateStep>,
    /// The first bucket the source reported last time (a prior for capping
    /// an expensive source before it drafts).
    last_bucket: usize,
    pub stats: GateStats,
}

impl<'d> GatedDrafter<'d> {
    pub fn new(inner: &'d mut dyn Drafter, source: Source, max_draft: usize) -> Self {
        Self {
            inner,
            source,
            gate: Gate::new(max_draft),
            buckets: Vec::new(),
            last: None,
            last_bucket: 0,
            stats: GateStats::default(),
        }
    }

    /// How far an expensive source (the MTP head, a pass per token) may
    /// draft at all this step; a cheap one (n-gram) drafts all it can and is
    /// cut after.
    fn cap(&self, max: usize) -> usize {
        match self.source {
            Source::Ngram => max,
            Source::Mtp => {
                let c = self.gate.choose(self.source, &vec![self.last_bucket; max]);
                c.k
            }
        }
    }

    fn count(&mut self, available: usize, c: &Choice) {
        let s = &mut self.stats;
        s.steps += 1;
        s.explored += u64::from(c.explore);
        if c.k > 0 {
            s.drafted_steps += 1;
            s.drafted += c.k as u64;
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

impl Drafter for GatedDrafter<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn draft(
        &mut self,
        target: &mut Context,
        corpus: &[Token],
        max: usize,
    ) -> Result<Vec<Token>, GenerateError> {
        let cap = self.cap(max);
        let mut draft = match cap {
            0 => Vec::new(),
            n => self.inner.draft(target, corpus, n)?,
        };
        let evidence = self.inner.evidence();
        let buckets: Vec<usize> = (0..draft.len())
            .map(|i| {
                let e = evidence.get(i).copied().unwrap_or(0.0);
                spec_gate::bucket(self.source, e)
            })
            .collect();
        if let Some(&b) = buckets.first() {
            self.last_bucket = b;
        }
        let mut choice = self.gate.choose(self.source, &buckets);
        // Capped before drafting: the source was held back from up to `max`.
        let available = if cap == 0 { max } else { draft.len() };
        if cap < max && (cap == 0 || choice.held_back.is_none()) {
            choice.held_back = Some(HeldBack::NotWorthIt);
        }
        draft.truncate(choice.k);
        self.buckets = buckets[..draft.len()].to_vec();
        self.count(available, &choice);
        self.last = Some(GateStep { available, choice });
        Ok(draft)
    }

    fn decoded(&mut self, target: &mut Context, batch: &Batch) -> Result<(), GenerateError> {
        self.inner.decoded(target, batch)
    }

    fn begin(&mut self, target: &mut Context, prompt: &[Token]) -> Result<(), GenerateError> {
        self.inner.begin(target, prompt)
    }

    fn accepted(&mut self, target: &mut Context, step: Accepted) -> Result<(), GenerateError> {
        let cost = StepCost {
            verify_s: step.verify.as_secs_f64(),
            draft_s: step.draft.as_secs_f64(),
        };
        let buckets = std::mem::take(&mut self.buckets);
        debug_assert_eq!(
            buckets.len(),
            step.drafted,
            "the loop verified what the gate chose"
        );
        self.gate
            .observe(self.source, &buckets, step.accepted, cost);
        self.inner.accepted(target, step)
    }

    fn gate_step(&self) -> Option<GateStep> {
        self.last
    }
}
