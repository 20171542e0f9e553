//! The model handle: llama.cpp's model, shared by the contexts on it, and
//! the turns its decodes take.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_sys_2 as sys;

use crate::llama::error::LlamaError;

/// A llama.cpp model, shared (`Arc`) by the contexts on it, which may live on
/// different threads (the target on the verify thread, the MTP head on the
/// draft actor's).
///
/// The one thing about a model that is written after load is its weight
/// tensors' data pointers: eval hooks point expert tensors at the flash
/// actor's arena and, with `--dense-weights anon`, dense tensors at anonymous
/// copies, from inside a decode (the eval callback). The tensors are the
/// model's, seen by every context on it. So decodes of one model take turns:
/// [`Context::decode`](super::context::Context::decode) holds the model's decode turn
/// ([`Model::decode_turn`]) for the whole `llama_decode`, and a second decode
/// of the same model while one runs is refused with an error (never waited
/// for: the contexts' owners hand the turn over by their own protocol, as the
/// verify loop and the draft actor do with their blocking request/reply). A
/// data pointer is therefore never rewritten while another decode reads it.
pub struct Model {
    pub(super) ptr: NonNull<sys::llama_model>,
    /// Whether a decode of a context on this model is running.
    pub(super) decoding: AtomicBool,
    /// Whether its MTP (nextn) blocks were loaded ([`ModelParams::load_mtp`]).
    pub(super) mtp_loaded: bool,
}

// SAFETY: after load, llama.cpp only reads a llama_model, except the tensor
// data pointers that eval hooks rewrite inside a decode, which holds the decode
// turn (see the type's docs): so moving the model between threads is sound.
unsafe impl Send for Model {}
// SAFETY: every `&self` method only reads the model; concurrent decodes of its
// contexts, the only writers of shared state (tensor data pointers), are
// refused by the decode turn (a compare-exchange, checked in Context::decode).
unsafe impl Sync for Model {}

/// A decode of a context on the model is running; dropped when it returns.
pub struct DecodeTurn<'a>(&'a AtomicBool);

impl Drop for DecodeTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Model {
    /// Take the model's decode turn, or fail when another context on the model
    /// is decoding right now (see the type's docs).
    pub fn decode_turn(&self) -> Result<DecodeTurn<'_>, LlamaError> {
        self.decoding
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| LlamaError::ConcurrentDecode)?;
        Ok(DecodeTurn(&self.decoding))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    pub(crate) fn vocab(&self) -> *const sys::llama_vocab {
        // The model pointer is valid for `self`'s lifetime; the vocab it
        // returns is owned by the model and lives as long.
        // SAFETY: as the comment above says.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    /// Trunk layers (excluding nextn/MTP blocks).
    pub fn n_layer(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_layer(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Whether the MTP (nextn) blocks were loaded, so that an MTP context
    /// can be created on it.
    pub(crate) fn mtp_loaded(&self) -> bool {
        self.mtp_loaded
    }

    /// MTP (nextn) blocks loaded after the trunk.
    pub fn n_layer_nextn(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_layer_nextn(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Attention heads (of the first layer).
    pub(crate) fn n_head(&self) -> u32 {
        // SAFETY: valid model pointer; pure getter.
        unsafe { sys::llama_model_n_head(self.ptr.as_ptr()) }.max(0) as u32
    }

    pub(crate) fn n_vocab(&self) -> usize {
        // SAFETY: valid vocab pointer owned by the model; pure getter.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) }.max(0) as usize
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // The pointer came from llama_model_load_from_file and is freed once;
        // contexts borrow the model, so none outlives it.
        // SAFETY: as the comment above says.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
    }
}
