//! A sequence's KV state out of and back into a context (llama.cpp's
//! `llama_state_seq_get_data` / `llama_state_seq_set_data`), for the prompt
//! cache.

use llama_cpp_sys_2 as sys;

use super::{Context, LlamaError};

impl Context {
    /// The KV state of sequence `seq`, as llama.cpp writes it.
    pub fn seq_state(&mut self, seq: i32) -> Result<Vec<u8>, LlamaError> {
        debug_assert!((0..self.n_seq() as i32).contains(&seq));
        // SAFETY: a valid context used from this thread (`&mut self`); a getter.
        let size = unsafe { sys::llama_state_seq_get_size(self.as_ptr(), seq) };
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds `size` writable bytes for the call's duration;
        // llama.cpp writes at most `size` bytes and returns how many.
        let n =
            unsafe { sys::llama_state_seq_get_data(self.as_ptr(), buf.as_mut_ptr(), size, seq) };
        if n == 0 || n > size {
            return Err(LlamaError::SeqState(format!(
                "llama.cpp wrote {n} of {size} bytes of sequence {seq}'s state"
            )));
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// Put `state` (from [`Self::seq_state`] of a context of the same model
    /// and settings) into sequence `seq`; what it held is dropped first. On
    /// an error the sequence is left empty.
    pub fn set_seq_state(&mut self, seq: i32, state: &[u8]) -> Result<(), LlamaError> {
        debug_assert!((0..self.n_seq() as i32).contains(&seq));
        self.trim_seq(seq, 0, -1);
        // SAFETY: `state` is readable for `len` bytes during the call;
        // llama.cpp checks the sizes it reads against `len` and returns 0 on a
        // state it cannot take, after clearing the sequence.
        let n = unsafe {
            sys::llama_state_seq_set_data(self.as_ptr(), state.as_ptr(), state.len(), seq)
        };
        if n != state.len() {
            self.trim_seq(seq, 0, -1);
            return Err(LlamaError::SeqState(format!(
                "llama.cpp took {n} of {} bytes of a saved state into sequence {seq}",
                state.len()
            )));
        }
        Ok(())
    }
}
