//! The target context while a generation may lend it to the MTP head: held by
//! the verify loop ([`Target`]) and lent, one call at a time, as a
//! [`TargetTurn`], on this thread or across to the draft actor's and back.
//!
//! Lending moves the exclusive borrow itself: [`Target::lend`] takes it out and
//! [`Target::restore`] puts it back, so while the head holds the target the
//! verify loop cannot touch it, and the compiler checks that no turn outlives
//! the borrow of the context it came from (the draft actor's thread is scoped
//! within that borrow). Nothing here erases a lifetime.

use std::marker::PhantomData;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::{context::Context, error::LlamaError};

/// The target context lent to the MTP head: the exclusive borrow of it, which,
/// unlike a `&mut Context`, may cross to the draft actor's thread and back.
/// Outside this module it gives access to the raw llama context only (for the
/// head's calls), never to the `Context`'s own state.
pub struct TargetTurn<'t> {
    ctx: &'t mut Context,
}

// SAFETY: a turn is an exclusive borrow of a llama context. llama.cpp contexts
// may be used from any thread, one thread at a time, and the exclusive borrow
// makes it one at a time. Other modules reach only the raw llama context
// through a turn (`ptr`, for the MTP head's calls), never the `Context`'s Rust
// state (its observer stays with the thread that holds the `Target`, which is
// not `Send`); dropping a turn drops a reference only.
unsafe impl Send for TargetTurn<'_> {}

impl<'t> TargetTurn<'t> {
    /// A turn of `ctx` (for a head driven on this thread; the verify loop
    /// lends its turns through [`Target`]).
    pub fn new(ctx: &'t mut Context) -> Self {
        Self { ctx }
    }

    /// The raw llama context the turn lends.
    pub(super) fn ptr(&self) -> NonNull<sys::llama_context> {
        self.ctx.non_null()
    }
}

/// The target context as a generation holds it: in hand for the verify loop's
/// decodes, or lent to the MTP head for one call.
pub struct Target<'t> {
    held: Option<TargetTurn<'t>>,
    /// Not `Send` (a `&mut Context` is not): the context's state stays here.
    _here: PhantomData<&'t mut Context>,
}

impl<'t> Target<'t> {
    pub(crate) fn new(ctx: &'t mut Context) -> Self {
        Self {
            held: Some(TargetTurn::new(ctx)),
            _here: PhantomData,
        }
    }

    /// The context, unless a lend never came back.
    pub(crate) fn ctx(&mut self) -> Result<&mut Context, LlamaError> {
        match self.held.as_mut() {
            Some(turn) => Ok(&mut *turn.ctx),
            None => Err(LlamaError::TargetLent),
        }
    }

    /// The turn, for a head driven on this thread.
    pub(crate) fn turn(&mut self) -> Result<&mut TargetTurn<'t>, LlamaError> {
        self.held.as_mut().ok_or(LlamaError::TargetLent)
    }

    /// Take the turn out, for a call on another thread; give it back with
    /// [`Self::restore`].
    pub(crate) fn lend(&mut self) -> Result<TargetTurn<'t>, LlamaError> {
        self.held.take().ok_or(LlamaError::TargetLent)
    }

    /// The turn a call lent is back.
    pub(crate) fn restore(&mut self, turn: TargetTurn<'t>) {
        self.held = Some(turn);
    }
}
