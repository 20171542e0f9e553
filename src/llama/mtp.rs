//! The MTP (nextn) draft head, driven through llama-cpp-sys-2's
//! `llama_rs_mtp_speculative_*` wrappers.
//!
//! The wrapper state holds raw pointers to the target context and to the
//! draft context. [`MtpHead`] owns the draft context and the state; the target
//! context is the caller's. The state reads the target (its hidden states) only
//! inside `begin`, `process`, `draft` and `accept`, and each of these takes a
//! [`TargetTurn`]: an exclusive borrow of that same target for the call. So
//! the target is alive and used by no one else whenever the head touches it,
//! and the compiler checks both. (Freeing the state touches only the draft
//! context.) The head may live on another thread than the target (the draft
//! actor); the turn is what crosses over, and back (`super::target`).

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::target::TargetTurn;
use super::{batch::Batch, batch::Token, context::Context, error::LlamaError};

/// The MTP draft head: a draft context of type MTP on the target's model, and
/// the speculative state tying it to the target context.
pub struct MtpHead {
    spec: NonNull<sys::llama_rs_mtp_speculative>,
    /// The target the state was tied to (every turn must be for it).
    target: NonNull<sys::llama_context>,
    // Dropped after `spec` is freed (Drop frees it first): the state points into it.
    draft: Context,
    max: usize,
    /// The draft context's n_batch: the largest batch `process` accepts.
    n_batch: usize,
}

fn status(what: &str, rc: sys::llama_rs_status) -> Result<(), LlamaError> {
    if rc == sys::LLAMA_RS_STATUS_OK {
        Ok(())
    } else {
        Err(LlamaError::Mtp(format!("{what} returned status {rc}")))
    }
}

impl MtpHead {
    /// Tie `draft` (a context of kind [`super::context::ContextKind::Mtp`] on the same
    /// model) to the target of `turn`. Call before the target's first decode
    /// (it turns on the target's hidden-state output).
    pub fn new(
        turn: &mut TargetTurn<'_>,
        draft: Context,
        max: usize,
        p_min: f32,
    ) -> Result<Self, LlamaError> {
        let max = max.max(1);
        // The target is borrowed exclusively for this call (the turn); the draft
        // is moved into the returned head and outlives `spec`. The state keeps
        // the target pointer but dereferences it only in calls holding a turn.
        // SAFETY: both context pointers are valid for the call, as above.
        let raw = unsafe {
            sys::llama_rs_mtp_speculative_init(
                turn.ptr().as_ptr(),
                draft.as_ptr(),
                max as i32,
                0,
                p_min,
            )
        };
        let spec = NonNull::new(raw)
            .ok_or_else(|| LlamaError::Mtp("llama_rs_mtp_speculative_init failed".into()))?;
        let n_batch = draft.n_batch() as usize;
        Ok(Self {
            spec,
            target: turn.ptr(),
            draft,
            max,
            n_batch,
        })
    }

    /// A turn for another context than the head's target is refused (the
    /// state would read the wrong hidden states).
    fn check(&self, turn: &TargetTurn<'_>) -> Result<(), LlamaError> {
        if turn.ptr() == self.target {
            Ok(())
        } else {
            Err(LlamaError::Mtp(
                "called with another target context than the one it was tied to".into(),
            ))
        }
    }

    /// What the head's own decodes cost since the last call (its context's observer).
    pub(crate) fn take_metrics(&mut self) -> bmoe_decode::metrics::DecodeMetrics {
        self.draft.take_metrics()
    }

    /// The first error of the draft context's observer.
    pub(crate) fn observer_failure(&self) -> Option<super::eval::ObserverFailure> {
        self.draft.observer_failure()
    }

    /// Feed a batch the target just decoded (its hidden states) to the head.
    pub(crate) fn process(
        &mut self,
        turn: &mut TargetTurn<'_>,
        batch: &Batch,
    ) -> Result<(), LlamaError> {
        self.check(turn)?;
        if batch.len() > self.n_batch {
            // The wrapper aborts (not an error code) on a batch above n_batch.
            return Err(LlamaError::BatchSize {
                tokens: batch.len(),
                n_batch: self.n_batch as u32,
            });
        }
        let raw = batch.raw();
        // SAFETY: the state is valid; `raw` describes arrays valid for n_tokens
        // entries that outlive the call; the target is ours for the call (turn).
        status("process", unsafe {
            sys::llama_rs_mtp_speculative_process(self.spec.as_ptr(), &raw)
        })
    }

    /// Start a generation after the prompt was processed.
    pub(crate) fn begin(
        &mut self,
        turn: &mut TargetTurn<'_>,
        prompt: &[Token],
    ) -> Result<(), LlamaError> {
        self.check(turn)?;
        // SAFETY: valid state; the token slice is valid for its length; the
        // target is ours for the call (turn).
        status("begin", unsafe {
            sys::llama_rs_mtp_speculative_begin(self.spec.as_ptr(), prompt.as_ptr(), prompt.len())
        })
    }

    /// Up to `max` (at most the head's width) draft tokens after `last` at
    /// position `n_past`, given the whole token history.
    pub(crate) fn draft(
        &mut self,
        turn: &mut TargetTurn<'_>,
        n_past: i32,
        last: Token,
        history: &[Token],
        max: usize,
    ) -> Result<Vec<Token>, LlamaError> {
        self.check(turn)?;
        let mut out = vec![0 as Token; self.max];
        let mut n = 0usize;
        // SAFETY: valid state; `history` is valid for its length; `out` has room
        // for `self.max` tokens, the most the state was created to draft; the
        // target is ours for the call (turn).
        status("draft", unsafe {
            sys::llama_rs_mtp_speculative_draft(
                self.spec.as_ptr(),
                n_past,
                last,
                history.as_ptr(),
                history.len(),
                out.as_mut_ptr(),
                out.len(),
                &mut n,
            )
        })?;
        out.truncate(n.min(max));
        Ok(out)
    }

    /// Tell the head how many of its last draft the target accepted (only
    /// after a draft that proposed something).
    pub(crate) fn accept(
        &mut self,
        turn: &mut TargetTurn<'_>,
        accepted: usize,
    ) -> Result<(), LlamaError> {
        self.check(turn)?;
        let n = u16::try_from(accepted).map_err(|_| LlamaError::Mtp("accept: too many".into()))?;
        // SAFETY: valid state; the target is ours for the call (turn).
        status("accept", unsafe {
            sys::llama_rs_mtp_speculative_accept(self.spec.as_ptr(), n)
        })
    }

    /// Drop the draft context's positions from `p0` on (its positions may only
    /// move forward).
    pub(crate) fn trim_draft(&mut self, p0: i32) -> bool {
        self.draft.trim(p0, -1)
    }
}

impl MtpHead {
    /// Empty the draft context's cache, so that the next batch it processes
    /// may start at any position (llama.cpp requires a sequence's positions
    /// to follow its last one, unless it holds none). Its first row is paired
    /// with the last hidden state the head kept, an older token's.
    pub(crate) fn forget(&mut self) -> Result<(), LlamaError> {
        match self.trim_draft(0) {
            true => Ok(()),
            false => Err(LlamaError::Mtp("could not empty the head's cache".into())),
        }
    }
}

impl Drop for MtpHead {
    fn drop(&mut self) {
        // SAFETY: created by llama_rs_mtp_speculative_init, freed once, before
        // the draft context (a field dropped after this runs). Freeing touches
        // the draft context only, never the target.
        unsafe { sys::llama_rs_mtp_speculative_free(self.spec.as_ptr()) };
    }
}
