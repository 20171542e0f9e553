//! A llama.cpp context: decode, logits, sequence trimming. It lives on the OS
//! thread that created it (`Context` is neither `Send` nor `Sync`).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bmoe_decode::metrics::DecodeMetrics;
use llama_cpp_sys_2 as sys;

use super::eval::{trampoline, ObserverCell};
use super::{batch::Batch, error::LlamaError, eval::EvalObserver, model::Model};

/// Which graph a context computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextKind {
    /// The ordinary target model.
    Target,
    /// The model's MTP (nextn) head as a draft context.
    Mtp,
}

/// How to build a context.
pub struct ContextParams {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub n_threads: u32,
    pub kind: ContextKind,
    /// Recurrent-state snapshots per sequence, for rollback on hybrid models.
    pub n_rs_seq: u32,
    /// Sequences decoded together (`bmoe serve --parallel`); each gets its
    /// own `n_ctx` positions of KV cache.
    pub n_seq: u32,
    /// Optional observer of the decode graph (see [`EvalObserver`]).
    pub observer: Option<Box<dyn EvalObserver>>,
    /// Abort flag shared with the observer (a fresh one when `None`).
    pub abort: Option<Arc<AtomicBool>>,
}

impl Default for ContextParams {
    fn default() -> Self {
        Self {
            n_ctx: 2048,
            n_batch: 512,
            n_ubatch: 512,
            n_threads: default_threads(),
            kind: ContextKind::Target,
            n_rs_seq: 0,
            n_seq: 1,
            observer: None,
            abort: None,
        }
    }
}

/// The number of physical-ish cores to use by default.
pub fn default_threads() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
        .min(16)
}

/// The most sequences one context carries (llama.cpp's own limit).
pub const MAX_SEQUENCES: u32 = 256;

pub struct Context {
    ptr: NonNull<sys::llama_context>,
    threadpool: *mut sys::ggml_threadpool,
    // Kept alive (and at a stable address) for llama.cpp's callback user data.
    _observer: Option<Box<ObserverCell>>,
    // Kept alive for llama.cpp's abort callback data (the flag's address).
    _abort: Arc<AtomicBool>,
    n_vocab: usize,
    n_ctx: u32,
    n_batch: u32,
    n_seq: u32,
    /// Whether its sequences' states move between sequence counts
    /// ([`Context::state_streams`]).
    pub(super) states_move: bool,
    // Dropped after the context (field order): the model must outlive it.
    model: Arc<Model>,
}

/// The abort callback llama.cpp polls between graph nodes: whether to stop.
///
/// # Safety
/// `data` must be the address of a live `AtomicBool` (the context's flag).
// SAFETY: the contract above; the context passes its own flag as `data`.
unsafe extern "C" fn abort_cb(data: *mut c_void) -> bool {
    // SAFETY: `data` is the address of the AtomicBool inside the Arc held by the
    // owning Context, which outlives the llama context.
    let stop = unsafe { &*(data as *const AtomicBool) }.load(Ordering::Relaxed);
    if stop {
        super::backend::note_stop();
    }
    stop
}

/// [`abort_cb`], and also stop when SIGINT/SIGTERM/SIGHUP asked the process
/// to stop: a long prefill ends within one graph node, not after the batch.
///
/// # Safety
/// As for [`abort_cb`].
// SAFETY: the contract above; the context passes its own flag as `data`.
unsafe extern "C" fn abort_or_signal_cb(data: *mut c_void) -> bool {
    if crate::interrupt::requested().is_some() {
        super::backend::note_stop();
        return true;
    }
    // SAFETY: as for `abort_cb`: `data` is the owning context's live flag.
    unsafe { abort_cb(data) }
}

/// llama.cpp's parameters for `params` with `n_seq` sequences (the abort
/// flag's and the observer's user data are set by [`Context::new`]).
fn raw_params(params: &ContextParams, n_seq: u32) -> sys::llama_context_params {
    // SAFETY: returns a plain struct by value.
    let mut cp = unsafe { sys::llama_context_default_params() };
    // Each sequence its own stream of `n_ctx` positions (not one pool).
    cp.n_ctx = params.n_ctx.saturating_mul(n_seq);
    cp.kv_unified = false;
    cp.n_batch = params.n_batch.max(params.n_ubatch);
    cp.n_ubatch = params.n_ubatch;
    cp.n_seq_max = n_seq;
    cp.n_rs_seq = params.n_rs_seq;
    cp.n_threads = params.n_threads as i32;
    cp.n_threads_batch = params.n_threads as i32;
    cp.no_perf = true;
    cp.ctx_type = match params.kind {
        ContextKind::Target => sys::LLAMA_CONTEXT_TYPE_DEFAULT,
        ContextKind::Mtp => sys::LLAMA_CONTEXT_TYPE_MTP,
    };
    // The target stops on a signal mid-decode; a draft head's decodes are
    // short, and the loop stops before the next one.
    cp.abort_callback = Some(match params.kind {
        ContextKind::Target => abort_or_signal_cb,
        ContextKind::Mtp => abort_cb,
    });
    cp
}

/// Why llama.cpp refused to create the context.
fn refused(model: &Model, params: &ContextParams) -> LlamaError {
    LlamaError::ContextFailed(match params.kind {
        ContextKind::Mtp if model.n_layer_nextn() == 0 => {
            "the model has no MTP (nextn) layers".to_string()
        }
        ContextKind::Mtp => "MTP context refused by llama.cpp".to_string(),
        ContextKind::Target => format!("n_ctx {} n_ubatch {}", params.n_ctx, params.n_ubatch),
    })
}

/// A persistent thread pool for `ctx` that sleeps instead of spinning
/// (poll = 0), so workers do not burn CPU while an eval callback blocks; null
/// when ggml could not make one (llama.cpp then uses its own).
fn attach_sleeping_threadpool(
    ctx: NonNull<sys::llama_context>,
    n_threads: u32,
) -> *mut sys::ggml_threadpool {
    // SAFETY: plain struct by value.
    let mut tpp = unsafe { sys::ggml_threadpool_params_default(n_threads as i32) };
    tpp.poll = 0;
    // SAFETY: `tpp` is a valid, initialised parameter struct.
    let threadpool = unsafe { sys::ggml_threadpool_new(&mut tpp) };
    if !threadpool.is_null() {
        // SAFETY: both pointers are valid; the pool is freed after the context in Drop.
        unsafe { sys::llama_attach_threadpool(ctx.as_ptr(), threadpool, threadpool) };
    }
    threadpool
}

impl Context {
    pub fn new(model: Arc<Model>, mut params: ContextParams) -> Result<Self, LlamaError> {
        if params.kind == ContextKind::Mtp && model.n_layer_nextn() > 0 && !model.mtp_loaded() {
            // llama.cpp aborts the process on an MTP graph without its block.
            return Err(LlamaError::ContextFailed(
                "the model was loaded without its MTP (nextn) block (ModelParams::load_mtp)".into(),
            ));
        }
        let n_seq = params.n_seq.clamp(1, MAX_SEQUENCES);
        let mut cp = raw_params(&params, n_seq);
        let abort = params
            .abort
            .take()
            .unwrap_or_else(|| Arc::new(AtomicBool::new(false)));
        cp.abort_callback_data = Arc::as_ptr(&abort) as *mut c_void;
        let mut observer = params
            .observer
            .take()
            .map(|o| Box::new(ObserverCell::new(o, abort.clone())));
        if let Some(cell) = observer.as_mut().filter(|c| c.observer.watches_nodes()) {
            cp.cb_eval = Some(trampoline);
            cp.cb_eval_user_data = (&mut **cell) as *mut ObserverCell as *mut c_void;
        }
        // SAFETY: the model pointer is valid and outlives the context (we hold an
        // Arc); the callback user data pointers stay valid because the boxes they
        // point into are stored in the returned Context.
        let raw = unsafe { sys::llama_init_from_model(model.as_ptr(), cp) };
        let ptr = NonNull::new(raw).ok_or_else(|| refused(&model, &params))?;
        let threadpool = attach_sleeping_threadpool(ptr, params.n_threads);
        // SAFETY: valid context pointer; pure getter (positions per sequence).
        let n_ctx = unsafe { sys::llama_n_ctx_seq(ptr.as_ptr()) };
        // SAFETY: valid context pointer; pure getter (llama.cpp may clamp n_batch to n_ctx).
        let n_batch = unsafe { sys::llama_n_batch(ptr.as_ptr()) };
        let mut ctx = Self {
            ptr,
            threadpool,
            _observer: observer,
            _abort: abort,
            n_vocab: model.n_vocab(),
            n_ctx,
            n_batch,
            n_seq,
            states_move: false,
            model,
        };
        ctx.states_move = ctx.probe_states_move();
        Ok(ctx)
    }

    /// The raw context, for the other FFI wrappers of this module.
    pub(crate) fn as_ptr(&self) -> *mut sys::llama_context {
        self.ptr.as_ptr()
    }

    /// The raw context as a non-null pointer (the MTP head's target).
    pub(super) fn non_null(&self) -> NonNull<sys::llama_context> {
        self.ptr
    }

    pub(crate) fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Positions each sequence may hold (prompt and reply together).
    pub(crate) fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// The largest batch one `decode` accepts (as llama.cpp settled it).
    pub(crate) fn n_batch(&self) -> u32 {
        self.n_batch
    }

    /// Run the model over `batch`.
    pub fn decode(&mut self, batch: &Batch) -> Result<(), LlamaError> {
        if batch.is_empty() || batch.len() > self.n_batch as usize {
            // llama.cpp asserts (aborts) on an oversized batch: refuse it here.
            return Err(LlamaError::BatchSize {
                tokens: batch.len(),
                n_batch: self.n_batch,
            });
        }
        // Hooks rewrite the model's shared weight pointers during the decode:
        // no other context of the model may decode meanwhile.
        let _turn = self.model.decode_turn()?;
        super::backend::clear_stop();
        if let Some(o) = self._observer.as_mut() {
            o.observer.decode_begin(batch.shape());
        }
        // SAFETY: the batch's arrays are valid for `n_tokens` entries and outlive
        // the call; the context is used only from this thread (`&mut self`).
        let rc = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw()) };
        if rc == 0 {
            // llama_decode may return with a backend still computing (an RPC
            // host's layers); the decode ends when its outputs are here.
            // SAFETY: the context is live and used from this thread only.
            unsafe { sys::llama_synchronize(self.ptr.as_ptr()) };
        }
        if let Some(o) = self._observer.as_mut() {
            o.observer.decode_end();
            if let Some(msg) = o.panic.clone() {
                return Err(LlamaError::ObserverPanicked(msg));
            }
        }
        match rc {
            0 => Ok(()),
            // 2: the abort callback stopped the graph.
            2 if crate::interrupt::requested().is_some() => Err(LlamaError::Interrupted),
            _ => Err(LlamaError::Decode(rc)),
        }
    }

    /// What the decodes since the last call cost, as the observer measured
    /// them (zeros without an observer).
    pub(crate) fn take_metrics(&mut self) -> DecodeMetrics {
        self._observer
            .as_mut()
            .map(|o| o.observer.take_metrics())
            .unwrap_or_default()
    }

    /// The observer's first error (it aborted a decode because of it).
    pub(crate) fn observer_failure(&self) -> Option<super::eval::ObserverFailure> {
        self._observer.as_ref().and_then(|o| o.observer.failure())
    }

    /// The logits row of batch entry `i` (which must have asked for logits in the last decode).
    pub fn logits(&self, i: i32) -> Option<&[f32]> {
        // SAFETY: valid context; returns null for a row without logits (and
        // llama.cpp logs the error rather than aborting in release builds).
        let p = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null logits row holds n_vocab floats owned by the context,
        // valid until the next decode, which needs `&mut self`.
        Some(unsafe { std::slice::from_raw_parts(p, self.n_vocab) })
    }

    /// Drop positions `[p0, p1)` of sequence 0 (`p1 < 0`: to the end). Returns false when
    /// the memory cannot do it (e.g. a recurrent model without snapshots).
    pub(crate) fn trim(&mut self, p0: i32, p1: i32) -> bool {
        self.trim_seq(0, p0, p1)
    }

    /// [`Self::trim`] for sequence `seq` (below the context's `n_seq`).
    pub(crate) fn trim_seq(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        debug_assert!(
            (0..self.n_seq as i32).contains(&seq),
            "sequence {seq} out of range"
        );
        // SAFETY: valid context; the memory handle is owned by it.
        let mem = unsafe { sys::llama_get_memory(self.ptr.as_ptr()) };
        // SAFETY: a valid memory handle; llama.cpp checks the sequence id.
        unsafe { sys::llama_memory_seq_rm(mem, seq, p0, p1) }
    }

    /// How many sequences one decode may carry.
    pub(crate) fn n_seq(&self) -> u32 {
        self.n_seq
    }

    /// Forget every cached position.
    pub fn clear(&mut self) {
        // SAFETY: valid context; the memory handle is owned by it.
        unsafe {
            let mem = sys::llama_get_memory(self.ptr.as_ptr());
            sys::llama_memory_clear(mem, true)
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: freed once; the thread pool is detached with the context and
        // freed after it, when no decode can use it any more.
        unsafe {
            sys::llama_free(self.ptr.as_ptr());
            if !self.threadpool.is_null() {
                sys::ggml_threadpool_free(self.threadpool);
            }
        }
    }
}
