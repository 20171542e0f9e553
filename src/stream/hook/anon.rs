//! Dense weights copied out of llama.cpp's file mapping into anonymous
//! memory (`--dense-weights anon`), shared by every hook on the model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bmoe_flash::{AnonBuffer, FlashError};

use crate::llama::NodeView;
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
pub(super) fn anon_copy(
    shared: &SharedAnon,
    src: &NodeView<'_>,
) -> Result<Option<*mut u8>, FlashError> {
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
    let copy = copy?;
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
