//! The MTP (nextn) draft head, driven through llama-cpp-sys-2's
//! `llama_rs_mtp_speculative_*` wrappers.
//!
//! The wrapper state holds raw pointers to the target context and to the
//! draft context. [`MtpHead`] owns the draft context and the state; the
//! target context is the caller's ([`TargetRef`]), and must outlive the head
//! and be used only between the head's calls (the loop hands over: draft,
//! verify decode, process, accept). The head may live on another thread than
//! the target (the draft actor); the hand-over is what keeps them apart.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::{Batch, Context, LlamaError, Token};

/// The target context, as the MTP state refers to it: a pointer that may be
/// sent to the draft actor's thread. It grants nothing by itself; the
/// [`MtpHead::new`] contract says when it may be used.
pub struct TargetRef(NonNull<sys::llama_context>);

// SAFETY: a bare pointer to a llama_context, never dereferenced by this type.
// llama.cpp contexts may be used from any thread, one thread at a time; the
// head's contract (MtpHead::new) makes its users hand the context over.
unsafe impl Send for TargetRef {}

impl TargetRef {
    pub fn new(target: &mut Context) -> Self {
        // SAFETY: as_ptr returns the context's non-null pointer.
        Self(unsafe { NonNull::new_unchecked(target.as_ptr()) })
    }
}

/// The MTP draft head: a draft context of type MTP on the target's model, and
/// the speculative state tying it to the target context.
pub struct MtpHead {
    spec: NonNull<sys::llama_rs_mtp_speculative>,
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
    /// Tie `draft` (a context of kind [`super::ContextKind::Mtp`] on the same
    /// model) to `target`. Call before the target's first decode (it turns on
    /// the target's hidden-state output).
    ///
    /// # Safety
    /// The target context must outlive the returned head, and must not be in
    /// use on any thread while `new` or a method of the head runs.
    pub unsafe fn new(
        target: TargetRef,
        draft: Context,
        max: usize,
        p_min: f32,
    ) -> Result<Self, LlamaError> {
        let max = max.max(1);
        // SAFETY: both context pointers are valid (the caller keeps the target
        // alive; the draft is moved into the returned head and outlives `spec`).
        let raw = unsafe {
            sys::llama_rs_mtp_speculative_init(
                target.0.as_ptr(),
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
            draft,
            max,
            n_batch,
        })
    }

    /// What the head's own decodes cost since the last call (its context's observer).
    pub fn take_metrics(&mut self) -> bmoe_actors::metrics::DecodeMetrics {
        self.draft.take_metrics()
    }

    /// The first error of the draft context's observer.
    pub fn observer_failure(&self) -> Option<String> {
        self.draft.observer_failure()
    }

    /// The largest batch [`process`](Self::process) takes.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Feed a batch the target just decoded (its hidden states) to the head.
    pub fn process(&mut self, batch: &Batch) -> Result<(), LlamaError> {
        if batch.len() > self.n_batch {
            // The wrapper aborts (not an error code) on a batch above n_batch.
            return Err(LlamaError::BatchSize {
                tokens: batch.len(),
                n_batch: self.n_batch as u32,
            });
        }
        let raw = batch.raw();
        // SAFETY: the state is valid; `raw` describes arrays valid for n_tokens
        // entries that outlive the call; the target is not decoding (caller).
        status("process", unsafe {
            sys::llama_rs_mtp_speculative_process(self.spec.as_ptr(), &raw)
        })
    }

    /// Start a generation after the prompt was processed.
    pub fn begin(&mut self, prompt: &[Token]) -> Result<(), LlamaError> {
        // SAFETY: valid state; the token slice is valid for its length.
        status("begin", unsafe {
            sys::llama_rs_mtp_speculative_begin(self.spec.as_ptr(), prompt.as_ptr(), prompt.len())
        })
    }

    /// Up to `max` (at most the head's width) draft tokens after `last` at
    /// position `n_past`, given the whole token history.
    pub fn draft(
        &mut self,
        n_past: i32,
        last: Token,
        history: &[Token],
        max: usize,
    ) -> Result<Vec<Token>, LlamaError> {
        let mut out = vec![0 as Token; self.max];
        let mut n = 0usize;
        // SAFETY: valid state; `history` is valid for its length; `out` has room
        // for `self.max` tokens, the most the state was created to draft.
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
    pub fn accept(&mut self, accepted: usize) -> Result<(), LlamaError> {
        let n = u16::try_from(accepted).map_err(|_| LlamaError::Mtp("accept: too many".into()))?;
        // SAFETY: valid state.
        status("accept", unsafe {
            sys::llama_rs_mtp_speculative_accept(self.spec.as_ptr(), n)
        })
    }

    /// Drop the draft context's positions from `p0` on (its positions may only
    /// move forward).
    pub fn trim_draft(&mut self, p0: i32) -> bool {
        self.draft.trim(p0, -1)
    }
}

impl Drop for MtpHead {
    fn drop(&mut self) {
        // SAFETY: created by llama_rs_mtp_speculative_init, freed once, before
        // the draft context (a field dropped after this runs).
        unsafe { sys::llama_rs_mtp_speculative_free(self.spec.as_ptr()) };
    }
}
