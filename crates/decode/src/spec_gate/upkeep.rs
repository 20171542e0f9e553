//! Whether a draft source that follows the target (the MTP head) keeps up
//! with it while the gate holds it back.
//!
//! The head drafts from its own cache of the target's past, which it keeps by
//! a catch-up pass over every decoded batch (a few percent of a decode on a
//! real model), paid whether it drafts or not. When the gate has held it back
//! for [`REST_AFTER`] steps in a row the head rests: it forgets its cache and
//! skips the catch-up. When the gate would let it draft again, it first wakes
//! (this step stays a plain decode and the head catches up on it, from an
//! empty cache) and drafts from the next step on. Pure policy: no model.

/// Steps held back in a row after which the head rests.
pub const REST_AFTER: u32 = 3;

/// The head's state between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upkeep {
    /// Catching up on every decode; held back on the last `held` steps.
    Awake { held: u32 },
    /// Its cache forgotten, no catch-up.
    Resting,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep::Awake { held: 0 }
    }
}

/// What the head does on one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadStep {
    /// Draft up to this many tokens, and catch up on the kept rows.
    Draft(usize),
    /// No draft; catch up on the decoded row.
    Hold,
    /// No draft, no catch-up; `forget`: drop the head's cache now (the first
    /// resting step).
    Rest { forget: bool },
    /// No draft this step; catch up on its decoded row from an empty cache,
    /// to draft from the next step on.
    Wake,
}

impl HeadStep {
    /// How far the head drafts this step.
    pub fn cap(self) -> usize {
        match self {
            HeadStep::Draft(n) => n,
            _ => 0,
        }
    }
}

impl Upkeep {
    /// The step for a gate that would let the head draft up to `cap` tokens
    /// (0: held back).
    pub fn step(&mut self, cap: usize) -> HeadStep {
        let (next, step) = match (*self, cap) {
            (Upkeep::Awake { .. }, n) if n > 0 => (Upkeep::Awake { held: 0 }, HeadStep::Draft(n)),
            (Upkeep::Awake { held }, _) if held + 1 >= REST_AFTER => {
                (Upkeep::Resting, HeadStep::Rest { forget: true })
            }
            (Upkeep::Awake { held }, _) => (Upkeep::Awake { held: held + 1 }, HeadStep::Hold),
            (Upkeep::Resting, 0) => (Upkeep::Resting, HeadStep::Rest { forget: false }),
            (Upkeep::Resting, _) => (Upkeep::Awake { held: 0 }, HeadStep::Wake),
        };
        *self = next;
        step
    }

    /// Whether the head skips its catch-up on the current step.
    pub fn resting(&self) -> bool {
        *self == Upkeep::Resting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(caps: &[usize]) -> Vec<HeadStep> {
        let mut u = Upkeep::default();
        caps.iter().map(|&c| u.step(c)).collect()
    }

    #[test]
    fn a_head_the_gate_lets_draft_never_rests() {
        let steps = run(&[2, 0, 0, 1, 0, 0, 3]);
        assert!(steps.iter().all(|s| !matches!(s, HeadStep::Rest { .. })));
        assert_eq!(steps[0], HeadStep::Draft(2));
        assert_eq!(steps[1], HeadStep::Hold);
        assert_eq!(steps[6].cap(), 3);
    }

    #[test]
    fn held_back_rest_after_steps_in_a_row_it_forgets_once_and_rests() {
        let steps = run(&[0; 6]);
        let n = REST_AFTER as usize;
        assert!(steps[..n - 1].iter().all(|s| *s == HeadStep::Hold));
        assert_eq!(steps[n - 1], HeadStep::Rest { forget: true });
        assert!(steps[n..]
            .iter()
            .all(|s| *s == HeadStep::Rest { forget: false }));
        assert!(steps.iter().all(|s| s.cap() == 0));
    }

    #[test]
    fn a_resting_head_wakes_for_one_plain_step_before_it_drafts() {
        let mut u = Upkeep::default();
        for _ in 0..REST_AFTER {
            u.step(0);
        }
        assert!(u.resting());
        assert_eq!(u.step(2), HeadStep::Wake);
        assert!(!u.resting(), "it catches up on the waking step's row");
        assert_eq!(u.step(2), HeadStep::Draft(2));
        // Held back again right after waking: it holds, then rests anew.
        let again: Vec<_> = (0..REST_AFTER).map(|_| u.step(0)).collect();
        assert_eq!(again.last(), Some(&HeadStep::Rest { forget: true }));
    }
}
