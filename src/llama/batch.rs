//! An owned `llama_batch` with explicit positions, sequence ids and output flags.

use llama_cpp_sys_2 as sys;

/// A vocabulary token id, as llama.cpp numbers them.
pub type Token = i32;

/// A token batch for [`super::context::Context::decode`].
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

impl Batch {
    /// A batch that can hold up to `capacity` tokens of one sequence each.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, i32::MAX as usize);
        // SAFETY: allocates arrays for `capacity` tokens with one seq id each;
        // freed exactly once in Drop.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        Self { raw, capacity }
    }

    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Keep only the first `n` entries.
    pub(crate) fn truncate(&mut self, n: usize) {
        if n < self.len() {
            // n < n_tokens <= i32::MAX: no wrap.
            self.raw.n_tokens = n as i32;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Append `token` at position `pos` in sequence 0; `logits` asks for its output row.
    /// Returns false when the batch is full.
    pub fn push(&mut self, token: Token, pos: i32, logits: bool) -> bool {
        self.push_seq(token, pos, 0, logits)
    }

    /// [`Self::push`] into sequence `seq` (below the context's `n_seq`).
    pub(crate) fn push_seq(&mut self, token: Token, pos: i32, seq: i32, logits: bool) -> bool {
        let i = self.raw.n_tokens as usize;
        if i >= self.capacity {
            return false;
        }
        // SAFETY: i < capacity, and llama_batch_init allocated `capacity` entries
        // for token/pos/n_seq_id/logits and `capacity` seq_id arrays of length 1.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = logits as i8;
        }
        self.raw.n_tokens += 1;
        true
    }

    /// Entry `i` as (token, position, logits flag).
    pub(crate) fn get(&self, i: usize) -> Option<(Token, i32, bool)> {
        if i >= self.len() {
            return None;
        }
        // SAFETY: i < n_tokens <= capacity: the arrays hold initialised entries there.
        unsafe {
            Some((
                *self.raw.token.add(i),
                *self.raw.pos.add(i),
                *self.raw.logits.add(i) != 0,
            ))
        }
    }

    /// Entry `i`'s sequence.
    pub(crate) fn seq(&self, i: usize) -> Option<i32> {
        if i >= self.len() {
            return None;
        }
        // SAFETY: i < n_tokens <= capacity: entry i's seq id array (length 1)
        // was written by `push_seq`.
        let seq = unsafe { *(*self.raw.seq_id.add(i)) };
        Some(seq)
    }

    /// Its rows and the rows that ask for logits.
    pub(crate) fn shape(&self) -> super::eval::BatchShape {
        let outputs = (0..self.len())
            .filter(|&i| self.get(i).is_some_and(|(_, _, logits)| logits))
            .count();
        super::eval::BatchShape {
            rows: self.len() as u32,
            outputs: outputs as u32,
        }
    }

    pub(crate) fn raw(&self) -> sys::llama_batch {
        self.raw
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: `raw` came from llama_batch_init and is freed once.
        unsafe { sys::llama_batch_free(self.raw) };
    }
}
