//! `--dense-weights anon`: dense weights copied out of llama.cpp's file
//! mapping into anonymous memory, shared by the hooks of every context on the
//! model, and the hook's rebinding of a node's dense sources to those copies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bmoe_flash::AnonBuffer;

use super::StreamHook;
use crate::llama::{llama_max_src, NodeView};
use crate::stream::memory;

/// [`DenseAnon`] shared by the hooks of every context on the model (the verify
/// context and the MTP draft context, which may run on another thread).
pub(crate) type SharedAnon = Arc<Mutex<DenseAnon>>;

/// Dense weights moved out of the file mapping into anonymous memory, tensor by
/// tensor, the first time a node reads them.
pub(crate) struct DenseAnon {
    /// Address ranges of llama.cpp's file mapping (only its mapped intervals: the
    /// holes it unmapped may hold other allocations later).
    mapped: Vec<(usize, usize)>,
    copies: HashMap<usize, AnonBuffer>,
    pub(crate) copied_bytes: u64,
}

impl DenseAnon {
    pub(crate) fn new(mapped: Vec<(usize, usize)>) -> Self {
        Self {
            mapped,
            copies: HashMap::new(),
            copied_bytes: 0,
        }
    }

    fn inside(&self, addr: usize, len: usize) -> bool {
        self.mapped
            .iter()
            .any(|&(a, b)| addr >= a && addr + len <= b)
    }
}

/// The anonymous copy of dense weight `src` (made now if it is new), or None
/// when `src` is not in llama.cpp's file mapping. The store's lock is never held
/// across the copy, which faults the tensor in from disk.
fn anon_copy(shared: &SharedAnon, src: &NodeView<'_>) -> Result<Option<*mut u8>, String> {
    let addr = src.data_addr();
    let len = src.nbytes() as usize;
    // A poisoned lock means a hook panicked while holding it: the store only
    // ever holds whole copies, so keep going.
    let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
    {
        let anon = lock();
        if let Some(c) = anon.copies.get(&addr) {
            return Ok(Some(c.as_ptr()));
        }
        if !anon.inside(addr, len) {
            return Ok(None);
        }
    }
    // SAFETY: [addr, addr + len) lies inside llama.cpp's readable file mapping
    // (checked above; the mapping lives as long as the model) and holds this
    // tensor's bytes.
    let copy = unsafe { AnonBuffer::copy_from(addr as *const u8, len) };
    let copy = copy.map_err(|e| e.to_string())?;
    let mut anon = lock();
    if let Some(c) = anon.copies.get(&addr) {
        // Copied meanwhile by the other context's hook: use that one.
        return Ok(Some(c.as_ptr()));
    }
    let ptr = copy.as_ptr();
    tracing::trace!(
        tensor = src.name(),
        bytes = len,
        "dense weight copied to anonymous memory"
    );
    anon.copied_bytes += len as u64;
    anon.copies.insert(addr, copy);
    drop(anon);
    memory::drop_pages(addr, len);
    Ok(Some(ptr))
}

impl StreamHook {
    /// Point every dense weight a node reads from the file mapping at an
    /// anonymous copy (made on first sight; the mapping's pages are then dropped).
    pub(super) fn bind_dense(&mut self, node: &NodeView<'_>) {
        let Some(shared) = self.opts.anon.clone() else {
            return;
        };
        for i in 0..llama_max_src() {
            let Some(src) = node.src(i) else { continue };
            // Only model weights still served from the file mapping (never
            // activations or caches, never the streamed experts).
            if !src.is_weight() || self.model.weights.contains_key(src.name()) {
                continue;
            }
            match anon_copy(&shared, &src) {
                Ok(None) => {}
                Ok(Some(copy)) => {
                    // The copy holds the tensor's exact bytes (nbytes) and lives in
                    // the shared store, which every hook on the model holds (and each
                    // context owns its hook), so it outlives every decode of every context.
                    // SAFETY: as above; no other decode of the model runs (decode turn).
                    unsafe { src.rebind_data(copy) }
                }
                Err(e) => {
                    self.fail(format!("--dense-weights anon: {e}"));
                    return;
                }
            }
        }
    }
}
