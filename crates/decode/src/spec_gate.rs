//! The speculation gate: before each verify step, the draft length k in
//! `0..=available` that maximises expected tokens per second,
//!
//! ```text
//! kept(k) / (verify(k + 1) + draft(k)),   kept(k) = 1 + sum_{i<=k} prod_{j<=i} p_j
//! ```
//!
//! where `p_j` is the chance that draft j is kept given drafts `1..j` were,
//! `verify(w)` the wall time of a target decode of width w on this host now
//! (with streaming, the extra expert bytes a wider batch reads are in it) and
//! `draft(k)` what drafting k tokens costs. k = 0 is the plain decode. Every
//! input is a running estimate from the steps already taken ([`Gate::observe`]),
//! so the same code holds back on a host where a wide batch is dear and drafts
//! far where it is cheap. Pure policy: no model, no clock. [`upkeep`] decides
//! when a held-back MTP head stops following the target.

pub mod upkeep;

/// Where a draft came from: each source keeps its own acceptance estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Ngram = 0,
    Mtp = 1,
}

/// How sure a source is of a drafted token, in a few buckets: the n-gram
/// match length, or the MTP head's probability of the token.
pub fn bucket(source: Source, evidence: f32) -> usize {
    let edges: &[f32] = match source {
        Source::Ngram => &[4.0, 6.0, 10.0],
        Source::Mtp => &[0.5, 0.8, 0.95],
    };
    edges.iter().take_while(|&&e| evidence >= e).count()
}

/// Buckets per source and position.
pub const BUCKETS: usize = 4;
/// Decode times kept per width; the estimate is their median (a decode at a
/// new width can be several times slower once, while llama.cpp builds its
/// graph, and must not hold the width back for the rest of the run).
const COST_SAMPLES: usize = 9;
/// Below this many samples a width's cost is the lower of its median and the
/// estimate from the narrower widths (optimism while it is still unknown).
const TRUSTED_SAMPLES: usize = 3;
/// Prior on an acceptance: worth one observation, of mean 0.5 for the first
/// draft and of the previous position's estimate for a later one (a source
/// good at one depth is likely good at the next).
const PRIOR_MEAN: f64 = 0.5;
const PRIOR_SEEN: f64 = 1.0;
/// A width not measured yet is assumed to cost this much more per extra row
/// than width 1 (corrected by the first decode of that width).
const UNSEEN_ROW_COST: f64 = 0.25;
/// After this many steps without a draft, one draft token is verified even
/// when the estimates say it does not pay, so that estimates made in other
/// conditions (a colder cache, another kind of text) can recover.
pub const EXPLORE_EVERY: u32 = 32;
/// Each exploration after which a draft could not pay even at a hopeful
/// acceptance (see [`HOPE_SIGMAS`]) doubles the wait before the next one, up
/// to this; after any other draft the wait is [`EXPLORE_EVERY`] again. A
/// source that keeps losing costs one wider decode in 257 steps instead of one
/// in 33, and one whose estimate is still unsure keeps being tried.
pub const EXPLORE_EVERY_MAX: u32 = 256;
/// A hopeful acceptance: the estimate plus this many standard errors of it.
const HOPE_SIGMAS: f64 = 2.0;

/// Kept/seen counts of one (source, position, bucket).
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    kept: f64,
    seen: f64,
}

impl Counts {
    fn p(&self, prior: f64) -> f64 {
        (self.kept + prior * PRIOR_SEEN) / (self.seen + PRIOR_SEEN)
    }
}

/// The gate's decision for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Drafts to verify (0: a plain decode).
    pub k: usize,
    /// Expected tokens this step keeps.
    pub expected_kept: f64,
    /// Predicted seconds of the verify decode plus drafting.
    pub predicted_s: f64,
    /// Why fewer than the available drafts (None: all of them).
    pub held_back: Option<HeldBack>,
    /// A one-token draft taken against the estimates, to refresh them.
    pub explore: bool,
}

/// Why the gate verified fewer drafts than it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBack {
    /// The source had nothing to draft.
    NoDraft,
    /// A shorter draft (maybe none) had the higher expected rate.
    NotWorthIt,
}

/// The running estimates and the choice made from them.
#[derive(Debug, Clone)]
pub struct Gate {
    max_draft: usize,
    /// [source][position 0..max_draft][bucket].
    acceptance: [Vec<[Counts; BUCKETS]>; 2],
    /// The last decodes of width w + 1 (newest last): seconds for width 1,
    /// the ratio to width 1's median at the time for the wider ones.
    verify_s: Vec<std::collections::VecDeque<f64>>,
    /// The last steps' drafting seconds per drafted token, per source (the
    /// estimate is their median: a source's first call can be several times
    /// slower while llama.cpp builds its graph, and must not price it out).
    draft_s_per_token: [std::collections::VecDeque<f64>; 2],
    /// Steps since the last one that verified a draft.
    since_draft: u32,
    /// Plain steps before the next exploration ([`EXPLORE_EVERY`] doubled
    /// per exploration in a row, up to [`EXPLORE_EVERY_MAX`]).
    explore_every: u32,
}

impl Gate {
    pub fn new(max_draft: usize) -> Self {
        let per_position = || vec![[Counts::default(); BUCKETS]; max_draft];
        Self {
            max_draft,
            acceptance: [per_position(), per_position()],
            verify_s: vec![std::collections::VecDeque::new(); max_draft + 1],
            draft_s_per_token: Default::default(),
            since_draft: 0,
            explore_every: EXPLORE_EVERY,
        }
    }

    /// The estimated chance that draft `i` (0-based) is kept given the ones
    /// before it were, for a token in `bucket`.
    /// A bucket's prior is its position's estimate over every bucket, whose
    /// own prior is the previous position's.
    pub fn p_keep(&self, source: Source, i: usize, bucket: usize) -> f64 {
        let table = &self.acceptance[source as usize];
        let b = bucket.min(BUCKETS - 1);
        let (mut prior, mut p) = (PRIOR_MEAN, PRIOR_MEAN);
        for position in table.iter().take(i + 1) {
            let pooled = position.iter().fold(Counts::default(), |a, c| Counts {
                kept: a.kept + c.kept,
                seen: a.seen + c.seen,
            });
            prior = pooled.p(prior);
            p = position[b].p(prior);
        }
        p
    }

    /// The median of the decode times measured at `width` (None: none yet),
    /// with how many there are.
    ///
    /// A wider decode is kept as its ratio to the plain decode's median at the
    /// time, and estimated as that ratio's median times the plain median now:
    /// the plain decode is measured on most steps, so as the expert cache warms
    /// or the host drifts, a width measured earlier follows.
    fn measured_s(&self, width: usize) -> Option<(f64, usize)> {
        let plain = median(&self.verify_s[0]);
        match width {
            0 => None,
            1 => plain,
            w => {
                let (ratio, n) = median(self.verify_s.get(w - 1)?)?;
                Some((ratio * plain?.0, n))
            }
        }
    }

    /// The estimated drafting seconds per drafted token of `source` (None
    /// before it drafted).
    pub fn draft_s_per_token(&self, source: Source) -> Option<f64> {
        median(&self.draft_s_per_token[source as usize]).map(|m| m.0)
    }

    /// The estimated wall seconds of a decode of `width` rows (None before any
    /// decode was measured).
    pub fn verify_cost_s(&self, width: usize) -> Option<f64> {
        let w = width.clamp(1, self.max_draft + 1);
        let own = self.measured_s(w);
        if let Some((s, n)) = own.filter(|o| o.1 >= TRUSTED_SAMPLES) {
            debug_assert!(n <= COST_SAMPLES);
            return Some(s);
        }
        // Not known yet: from the nearest measured narrower width, at the cost
        // per extra row seen between it and the next measured one below it
        // (a fixed share when there is none), so that each width gets tried
        // when the widths below it were cheap.
        let measured = |below: usize| {
            (1..below)
                .rev()
                .find_map(|v| self.measured_s(v).map(|(s, _)| (v, s)))
        };
        let guess = measured(w).map(|(base_w, base)| {
            // Half the slope seen below: optimistic while unknown, so a
            // width that may pay is decoded a few times and then judged.
            let per_row_s = match measured(base_w) {
                Some((v, s)) => (0.5 * (base - s) / (base_w - v) as f64).max(0.0),
                None => UNSEEN_ROW_COST * base,
            };
            base + per_row_s * (w - base_w) as f64
        });
        match (own, guess) {
            (Some((s, _)), Some(g)) => Some(s.min(g)),
            (Some((s, _)), None) => Some(s),
            (None, g) => g,
        }
    }

    /// The best k for a draft whose tokens fall in `buckets` (one per drafted
    /// token, `buckets.len()` drafts available).
    pub fn choose(&self, source: Source, buckets: &[usize]) -> Choice {
        let available = buckets.len().min(self.max_draft);
        let draft_per_token = self.draft_s_per_token(source).unwrap_or(0.0);
        let mut best = Choice {
            k: 0,
            expected_kept: 1.0,
            predicted_s: self.verify_cost_s(1).unwrap_or(0.0),
            held_back: Some(HeldBack::NoDraft),
            explore: false,
        };
        let Some(plain) = self.verify_cost_s(1).filter(|&s| s > 0.0) else {
            // No plain decode measured yet: take one, every cost is judged by it.
            if available > 0 {
                best.held_back = Some(HeldBack::NotWorthIt);
            }
            return best;
        };
        let mut best_rate = 1.0 / plain;
        let (mut kept, mut chain) = (1.0, 1.0);
        for (i, &b) in buckets.iter().take(available).enumerate() {
            chain *= self.p_keep(source, i, b);
            kept += chain;
            let k = i + 1;
            let cost = self.verify_cost_s(k + 1).unwrap_or(plain) + draft_per_token * k as f64;
            if kept / cost > best_rate {
                best_rate = kept / cost;
                best = Choice {
                    k,
                    expected_kept: kept,
                    predicted_s: cost,
                    held_back: None,
                    explore: false,
                };
            }
        }
        if available > 0 && best.k < available {
            best.held_back = Some(HeldBack::NotWorthIt);
        }
        if available > 0 && best.k == 0 && self.since_draft >= self.explore_every {
            let p = self.p_keep(source, 0, buckets[0]);
            let cost = self.verify_cost_s(2).unwrap_or(plain) + draft_per_token;
            best = Choice {
                k: 1,
                expected_kept: 1.0 + p,
                predicted_s: cost,
                held_back: Some(HeldBack::NotWorthIt).filter(|_| available > 1),
                explore: true,
            };
        }
        best
    }

    /// A draft token the gate chose not to verify (position `i`, 0-based, all
    /// drafts before it verified and kept), judged anyway by the token the
    /// target produced in its place: a free observation of its acceptance for
    /// a source whose drafts cost nothing to have (the n-gram matcher), so a
    /// held-back source's estimates keep learning.
    pub fn observe_unverified(&mut self, source: Source, i: usize, bucket: usize, kept: bool) {
        let table = &mut self.acceptance[source as usize];
        if let Some(c) = table.get_mut(i).map(|t| &mut t[bucket.min(BUCKETS - 1)]) {
            c.seen += 1.0;
            c.kept += f64::from(u8::from(kept));
        }
    }

    /// Count a step with or without a verified draft. A draft after at least
    /// `explore_every` steps without one is the exploration: when even a
    /// `hopeful` acceptance would not pay, the next one waits twice as long.
    /// A draft sooner than that was the gate's own choice: the wait goes back
    /// to [`EXPLORE_EVERY`], as it does while a draft could still pay.
    fn count_draft(&mut self, drafted: bool, hopeful: bool) {
        if !drafted {
            self.since_draft = self.since_draft.saturating_add(1);
            return;
        }
        let explored = self.since_draft >= self.explore_every;
        self.explore_every = match explored && !hopeful {
            true => self.explore_every.saturating_mul(2).min(EXPLORE_EVERY_MAX),
            false => EXPLORE_EVERY,
        };
        self.since_draft = 0;
        debug_assert!((EXPLORE_EVERY..=EXPLORE_EVERY_MAX).contains(&self.explore_every));
    }

    /// Plain steps the gate waits, from the last verified draft, before it
    /// explores.
    pub fn explore_every(&self) -> u32 {
        self.explore_every
    }

    /// What a step cost and kept: the decode of `width` rows took `verify_s`,
    /// drafting `k = buckets.len()` tokens took `draft_s`, and `kept` of them
    /// were confirmed by the target.
    pub fn observe(&mut self, source: Source, buckets: &[usize], kept: usize, cost: StepCost) {
        let width = buckets.len() + 1;
        let plain = self.measured_s(1).map(|p| p.0).filter(|&p| p > 0.0);
        // A wider decode costs at least a plain one: a ratio under 1 is noise
        // or a stale plain estimate (one slow first plain decode, never
        // measured again while the gate drafts), and a wider decode faster
        // than the plain estimate is a plain sample too.
        let sample = match (width, plain) {
            (1, _) => Some(cost.verify_s),
            (_, Some(p)) => Some((cost.verify_s / p).max(1.0)),
            (_, None) => None,
        };
        if let (Some(samples), Some(x)) = (self.verify_s.get_mut(width - 1), sample) {
            push_sample(samples, x);
        }
        if width > 1 && plain.is_some_and(|p| cost.verify_s < p) {
            push_sample(&mut self.verify_s[0], cost.verify_s);
        }
        if !buckets.is_empty() {
            let per_token = cost.draft_s / buckets.len() as f64;
            push_sample(&mut self.draft_s_per_token[source as usize], per_token);
        }
        let table = &mut self.acceptance[source as usize];
        // Positions up to the first rejection were seen; the ones after were not.
        for (i, &b) in buckets.iter().enumerate().take(kept + 1) {
            if let Some(c) = table.get_mut(i).map(|t| &mut t[b.min(BUCKETS - 1)]) {
                c.seen += 1.0;
                c.kept += f64::from(u8::from(i < kept));
            }
        }
        let this_wide_s = Some(cost.verify_s).filter(|_| width == 2);
        let hopeful = buckets
            .first()
            .is_some_and(|&b| self.could_pay(source, b, this_wide_s));
        self.count_draft(!buckets.is_empty(), hopeful);
    }

    /// Whether one draft token in `bucket` would pay at a hopeful acceptance
    /// (the estimate plus [`HOPE_SIGMAS`] standard errors) and the cheaper of
    /// the 2-row decode's estimate and `this_wide_s` (the one just measured,
    /// news the median has not taken in yet): false once enough drafts were
    /// judged to show it does not.
    fn could_pay(&self, source: Source, bucket: usize, this_wide_s: Option<f64>) -> bool {
        let (Some(plain), Some(wide)) = (self.verify_cost_s(1), self.verify_cost_s(2)) else {
            return true;
        };
        let wide = this_wide_s.map_or(wide, |s| s.min(wide));
        let p = self.p_keep(source, 0, bucket);
        let seen = self.acceptance[source as usize]
            .first()
            .map_or(0.0, |t| t[bucket.min(BUCKETS - 1)].seen);
        let hope = (p + HOPE_SIGMAS * (p * (1.0 - p) / (seen + PRIOR_SEEN)).sqrt()).min(1.0);
        let draft_s = self.draft_s_per_token(source).unwrap_or(0.0);
        (1.0 + hope) * plain > wide + draft_s
    }
}

/// The measured cost of one verify step: its decode, and the source's
/// drafting call (what drafting more tokens adds; a head's catch-up on the
/// kept rows of the previous step is paid whatever is drafted, so it is not
/// in it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub verify_s: f64,
    pub draft_s: f64,
}

/// The median of `samples` and how many there are.
fn median(samples: &std::collections::VecDeque<f64>) -> Option<(f64, usize)> {
    let mut v: Vec<f64> = samples.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).map(|&m| (m, v.len()))
}

/// Keep the last [`COST_SAMPLES`] of a cost.
fn push_sample(samples: &mut std::collections::VecDeque<f64>, x: f64) {
    if samples.len() == COST_SAMPLES {
        samples.pop_front();
    }
    samples.push_back(x);
}

#[cfg(test)]
mod tests;
