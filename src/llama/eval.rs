//! The eval-callback trampoline: lets a safe observer watch (and later stall at)
//! named graph nodes while llama.cpp computes a decode.
//!
//! llama.cpp's scheduler calls `cb(t, ask = true)` node by node until one
//! returns true, computes up to that node, synchronizes, and then calls
//! `cb(t, ask = false)` on the decoding thread. The trampoline always returns
//! true from the `ask = false` call: returning false there makes the decode
//! "succeed" with garbage. Aborting is done through the abort callback instead:
//! an observer that panics sets the context's abort flag, and the decode fails
//! with the panic's message.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use bmoe_decode::metrics::DecodeMetrics;

/// A read-only view of one graph node during the eval callback.
///
/// Data accessors are meaningful only in [`EvalObserver::observe`] (after the
/// node has been computed); in [`EvalObserver::wants`] only the name and shape are.
pub struct NodeView<'a> {
    t: *mut sys::ggml_tensor,
    _life: PhantomData<&'a sys::ggml_tensor>,
}

impl<'a> NodeView<'a> {
    /// # Safety
    /// `t` must point to a live tensor for the lifetime `'a`.
    unsafe fn new(t: *mut sys::ggml_tensor) -> Self {
        Self {
            t,
            _life: PhantomData,
        }
    }

    fn raw(&self) -> &sys::ggml_tensor {
        // SAFETY: `t` is live for 'a (constructor contract) and only read here.
        unsafe { &*self.t }
    }

    /// The node's name, e.g. `ffn_moe_topk-12`.
    pub fn name(&self) -> &str {
        let name = &self.raw().name;
        // SAFETY: ggml keeps `name` NUL-terminated within its fixed-size array.
        let c = unsafe { CStr::from_ptr(name.as_ptr()) };
        c.to_str().unwrap_or("")
    }

    /// Element counts, ggml order (ne0 first).
    pub fn ne(&self) -> [i64; 4] {
        self.raw().ne
    }

    /// Byte strides, ggml order.
    pub(crate) fn nb(&self) -> [u64; 4] {
        self.raw().nb.map(|x| x as u64)
    }

    /// An expert matmul (`GGML_OP_MUL_MAT_ID`): src 0 is the stacked expert
    /// weight tensor, src 2 the routed ids.
    pub(crate) fn is_mul_mat_id(&self) -> bool {
        self.raw().op == sys::GGML_OP_MUL_MAT_ID
    }

    /// Source tensor `i` of this node.
    pub(crate) fn src(&self, i: usize) -> Option<NodeView<'a>> {
        let p = *self.raw().src.get(i)?;
        // SAFETY: a node's sources outlive the node (they belong to the same graph
        // or are model weights), so they are live for 'a as well.
        (!p.is_null()).then(|| unsafe { NodeView::new(p) })
    }

    /// Whether this tensor is a model weight in this process's memory
    /// (allocated in a host weights buffer; an RPC host's weights are not).
    pub(crate) fn is_weight(&self) -> bool {
        let b = self.raw().buffer;
        if b.is_null() {
            return false;
        }
        // SAFETY: a non-null buffer pointer of a live tensor is a live buffer.
        let usage = unsafe { sys::ggml_backend_buffer_get_usage(b) };
        // SAFETY: as above.
        usage == sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS
            && unsafe { sys::ggml_backend_buffer_is_host(b) }
    }

    /// The address the kernels read this tensor's bytes from.
    pub(crate) fn data_addr(&self) -> usize {
        self.raw().data as usize
    }

    /// Total bytes of the tensor's data (ggml_nbytes).
    pub(crate) fn nbytes(&self) -> u64 {
        // SAFETY: a live tensor; pure computation from its shape and type.
        unsafe { sys::ggml_nbytes(self.t) as u64 }
    }

    /// Point this tensor's data at `ptr` (used to serve expert weights from
    /// engine-owned memory, in the ask phase of the matmul that reads them).
    ///
    /// # Safety
    /// `ptr` must be valid for reads of [`nbytes`](Self::nbytes) bytes, laid out
    /// exactly as the tensor's own data, for as long as any decode may read this
    /// tensor, and the bytes the computation actually reads must be initialised.
    pub(crate) unsafe fn rebind_data(&self, ptr: *mut u8) {
        // SAFETY: `t` is live (constructor contract); writing the data pointer
        // of a weight tensor is what ggml's own allocators do; validity of `ptr`
        // is the caller's contract.
        unsafe { (*self.t).data = ptr as *mut std::ffi::c_void };
    }

    pub(crate) fn is_i32(&self) -> bool {
        self.raw().type_ == sys::GGML_TYPE_I32
    }

    pub(crate) fn is_f32(&self) -> bool {
        self.raw().type_ == sys::GGML_TYPE_F32
    }

    /// Whether the node's data lives in host memory that can be read directly.
    fn host_data(&self) -> Option<*const u8> {
        let r = self.raw();
        if r.data.is_null() {
            return None;
        }
        if !r.buffer.is_null() {
            // SAFETY: a non-null buffer pointer belongs to this live tensor.
            if !unsafe { sys::ggml_backend_buffer_is_host(r.buffer) } {
                return None;
            }
        }
        Some(r.data as *const u8)
    }

    /// Copy a 2-D I32 tensor (respecting its strides) into `out`, row-major
    /// `[ne1][ne0]`. Returns false when the node is not a host I32 tensor.
    /// This is how the routed expert ids of `ffn_moe_topk-N` (a non-contiguous
    /// view) are read.
    pub fn copy_i32_2d(&self, out: &mut Vec<i32>) -> bool {
        self.is_i32() && self.copy_2d(out)
    }

    /// Copy a tensor of F32 values with shape [ne0, ne1] (strided) into `out`.
    pub(crate) fn copy_f32_2d(&self, out: &mut Vec<f32>) -> bool {
        self.is_f32() && self.copy_2d(out)
    }

    /// Byte address of element `idx` (ggml order) of a host tensor of element
    /// size `size`, or None when out of bounds or not host memory.
    fn element(&self, idx: [u64; 3], size: u64) -> Option<*mut u8> {
        let base = self.host_data()?;
        let ne = self.ne();
        let nb = self.nb();
        if (0..3).any(|d| idx[d] >= ne[d].max(0) as u64) || nb[0] < size {
            return None;
        }
        let off = idx[0] * nb[0] + idx[1] * nb[1] + idx[2] * nb[2];
        Some(base.wrapping_add(off as usize) as *mut u8)
    }

    /// Overwrite one I32 element (observe phase only: the node is computed and
    /// nothing reads or writes it until the callback returns). Returns false when
    /// the node is not a host I32 tensor or `idx` is out of bounds.
    ///
    /// # Safety
    /// Call only from [`EvalObserver::observe`] of this node or of a later node
    /// whose computation has not yet consumed it, so the write is seen by the
    /// nodes that read it afterwards and races with nothing.
    pub(crate) unsafe fn set_i32(&self, idx: [u64; 3], v: i32) -> bool {
        if !self.is_i32() {
            return false;
        }
        let Some(p) = self.element(idx, 4) else {
            return false;
        };
        // SAFETY: inside the tensor's host data (bounds checked by `element`);
        // no concurrent access per the caller's contract.
        unsafe { (p as *mut i32).write_unaligned(v) };
        true
    }

    /// Overwrite one F32 element; see [`set_i32`](Self::set_i32).
    ///
    /// # Safety
    /// As [`set_i32`](Self::set_i32).
    pub(crate) unsafe fn set_f32(&self, idx: [u64; 3], v: f32) -> bool {
        if !self.is_f32() {
            return false;
        }
        let Some(p) = self.element(idx, 4) else {
            return false;
        };
        // SAFETY: as in set_i32.
        unsafe { (p as *mut f32).write_unaligned(v) };
        true
    }

    /// Copy the first two dimensions, honouring the strides; `T` must be the
    /// tensor's element type (the public wrappers check it).
    fn copy_2d<T: Copy>(&self, out: &mut Vec<T>) -> bool {
        let Some(base) = self.host_data() else {
            return false;
        };
        let [ne0, ne1, _, _] = self.ne();
        let [nb0, nb1, _, _] = self.nb();
        out.clear();
        out.reserve((ne0 * ne1).max(0) as usize);
        for i1 in 0..ne1.max(0) as u64 {
            for i0 in 0..ne0.max(0) as u64 {
                // Views may start anywhere, hence the unaligned read.
                // SAFETY: (i0, i1) < ne, so the offset is inside the view its own strides
                // describe; computed host data (observe phase) of element type T (callers check).
                let v = unsafe {
                    (base.add((i1 * nb1 + i0 * nb0) as usize) as *const T).read_unaligned()
                };
                out.push(v);
            }
        }
        true
    }
}

/// How many sources a graph node can have (GGML_MAX_SRC, the length of `src`).
pub fn llama_max_src() -> usize {
    SRC_LEN
}

// The bindings do not export the GGML_MAX_SRC macro: take the length of the
// bound struct's `src` array instead (the same fact, checked by the compiler).
const SRC_LEN: usize = {
    const fn len<T, const N: usize>(_: fn(&T) -> &[*mut sys::ggml_tensor; N]) -> usize {
        N
    }
    len(|t: &sys::ggml_tensor| &t.src)
};

/// A decode's batch as an observer sees it: its rows (tokens) and how many of
/// them ask for logits (all of a verify's, one of a prompt's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchShape {
    pub rows: u32,
    pub outputs: u32,
}

/// Watches a decode node by node. Lives on the thread that owns the context.
pub trait EvalObserver {
    /// Ask phase (node not computed yet): return true to have [`observe`]
    /// called once this node is computed. Every true splits the graph there.
    ///
    /// [`observe`]: EvalObserver::observe
    fn wants(&mut self, node: &NodeView<'_>) -> bool;
    /// The node has been computed. Blocking here stalls the decode at this point.
    fn observe(&mut self, node: &NodeView<'_>);
    /// Whether [`wants`](EvalObserver::wants) is to be asked at all: false
    /// sets no eval callback on the context (only `decode_begin`/`decode_end`
    /// are called), so ggml's scheduler computes each split as one graph.
    fn watches_nodes(&self) -> bool {
        true
    }
    /// A decode of `batch` is about to start (called by
    /// [`Context::decode`](super::context::Context::decode)).
    fn decode_begin(&mut self, _batch: BatchShape) {}
    /// The decode returned (successfully or not).
    fn decode_end(&mut self) {}
    /// What the decodes since the last call cost (handed out by
    /// [`Context::take_metrics`](super::context::Context::take_metrics)).
    fn take_metrics(&mut self) -> DecodeMetrics {
        DecodeMetrics::default()
    }
    /// The first error that made the observer abort a decode, if any (sticky).
    fn failure(&self) -> Option<ObserverFailure> {
        None
    }
}

/// The error that made an observer abort a decode: the observer's own typed
/// error (the seam names no observer's type), shared so every reader sees it.
pub type ObserverFailure = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// Heap cell whose address is handed to llama.cpp as the callback's user data.
pub(crate) struct ObserverCell {
    pub(crate) observer: Box<dyn EvalObserver>,
    /// Set when the observer panics, so the decode stops at the next node.
    pub(crate) abort: Arc<AtomicBool>,
    /// The first panic's message; the decode that met it fails with it.
    pub(crate) panic: Option<String>,
}

impl ObserverCell {
    pub(crate) fn new(observer: Box<dyn EvalObserver>, abort: Arc<AtomicBool>) -> Self {
        Self {
            observer,
            abort,
            panic: None,
        }
    }
}

/// A panic payload as text.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Observer-phase node "done"; ask-phase "do not split here" after a panic.
pub(crate) unsafe extern "C" fn trampoline(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user: *mut c_void,
) -> bool {
    if t.is_null() || user.is_null() {
        return !ask;
    }
    // SAFETY: `user` is the address of the `ObserverCell` boxed inside the owning
    // `Context`, which outlives every decode; the callback runs on the decoding
    // thread only, so no other reference to the cell is live.
    let cell = unsafe { &mut *(user as *mut ObserverCell) };
    if cell.panic.is_some() {
        // The decode is being aborted: the observer is not called again.
        return !ask;
    }
    // SAFETY: llama.cpp passes a tensor that is live for the duration of the call.
    let node = unsafe { NodeView::new(t) };
    let observer = &mut cell.observer;
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if ask {
            observer.wants(&node)
        } else {
            observer.observe(&node);
            true
        }
    }));
    match res {
        Ok(v) => v,
        Err(p) => {
            let msg = panic_message(&*p);
            tracing::error!(
                "eval observer panicked at {}: {msg}; aborting the decode",
                node.name()
            );
            cell.panic = Some(msg);
            // The CPU backend checks the abort callback after every node, so no
            // node after the next one computes; the decode then fails with the
            // panic (Context::decode), never finishing on what the observer
            // failed to prepare. Never false in the observe phase (that would
            // yield garbage silently).
            cell.abort.store(true, Ordering::SeqCst);
            !ask
        }
    }
}
