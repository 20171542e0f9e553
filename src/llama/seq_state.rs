//! A sequence's KV state out of and back into a context (llama.cpp's
//! `llama_state_seq_get_data` / `llama_state_seq_set_data`), for the prompt
//! cache.
//!
//! llama.cpp writes a sequence's state as `magic u32 | seq_id i32 |` the
//! memory's state; a plain KV cache's is `n_stream u32`, then for each
//! stream `cell_count u32` and, when not 0, that stream's cells
//! (`llama_kv_cache::state_write`). With `kv_unified = false` each sequence
//! is a stream of its own (sequence `s` in stream `s`), so the state of one
//! sequence has one stream with cells and `n_stream - 1` empty ones; and
//! `state_read` refuses a state of another `n_stream` ("n_stream mismatch")
//! while it reads any stream's cells into the target sequence's stream. So
//! bmoe keeps such a state as one of a single stream (the cells' stream
//! alone) and widens it back to the context's streams when it restores it:
//! a state saved at `--parallel 1` restores at `--parallel 2` and back.
//! Other memories (sliding-window, recurrent, hybrid) keep llama.cpp's
//! bytes as they are, for the same sequence count only.

use llama_cpp_sys_2 as sys;

use super::{context::Context, error::LlamaError};

/// `magic | seq_id | n_stream`: the bytes before the first stream.
const HEAD: usize = 12;

impl Context {
    /// The KV state of sequence `seq`, as llama.cpp writes it (narrowed to
    /// one stream when the context's states move between sequence counts,
    /// [`Self::state_streams`]).
    pub fn seq_state(&mut self, seq: i32) -> Result<Vec<u8>, LlamaError> {
        let buf = self.raw_seq_state(seq)?;
        if self.state_streams() == self.n_seq() {
            return Ok(buf);
        }
        narrow(&buf, self.n_seq(), seq as u32).ok_or_else(|| {
            LlamaError::SeqState(format!(
                "sequence {seq}'s state is not one stream's cells of {}",
                self.n_seq()
            ))
        })
    }

    fn raw_seq_state(&mut self, seq: i32) -> Result<Vec<u8>, LlamaError> {
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
    /// and settings, and the same [`Self::state_streams`]) into sequence
    /// `seq`; what it held is dropped first. On an error the sequence is
    /// left empty.
    pub fn set_seq_state(&mut self, seq: i32, state: &[u8]) -> Result<(), LlamaError> {
        debug_assert!((0..self.n_seq() as i32).contains(&seq));
        self.trim_seq(seq, 0, -1);
        let wide;
        let state = match self.state_streams() == self.n_seq() {
            true => state,
            false => {
                wide = widen(state, self.n_seq()).ok_or_else(|| {
                    LlamaError::SeqState("a saved state that is not of one stream".into())
                })?;
                &wide[..]
            }
        };
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

    /// The KV streams the states this context writes and reads are laid out
    /// for: 1 when they move between sequence counts (one sequence, or a
    /// plain KV cache), else the context's sequence count.
    pub fn state_streams(&self) -> u32 {
        match self.states_move {
            true => 1,
            false => self.n_seq(),
        }
    }

    /// Whether this context's memory is a plain KV cache of a stream per
    /// sequence (asked once, while every sequence is empty): an empty
    /// sequence's state is then `magic | seq | n_seq | n_seq × 0u32`
    /// (a sliding-window cache writes two such, a recurrent one no stream
    /// count, a hybrid one more after it).
    pub(super) fn probe_states_move(&mut self) -> bool {
        let n = self.n_seq();
        n == 1
            || self.raw_seq_state(0).is_ok_and(|b| {
                b.len() == HEAD + 4 * n as usize
                    && word(&b, 8) == Some(n)
                    && b[HEAD..].iter().all(|&x| x == 0)
            })
    }
}

/// The little-endian u32 at `at`.
fn word(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at + 4)?;
    Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// The state of `n_stream` streams whose cells are in stream `stream` as the
/// state of one stream (None: not of that shape).
pub(crate) fn narrow(b: &[u8], n_stream: u32, stream: u32) -> Option<Vec<u8>> {
    let (before, after) = (4 * stream as usize, 4 * (n_stream - 1 - stream) as usize);
    let cells = HEAD + before;
    let end = b.len().checked_sub(after)?;
    let shaped = word(b, 8) == Some(n_stream)
        && b.get(HEAD..cells)?.iter().all(|&x| x == 0)
        && word(b, cells).is_some_and(|c| c > 0)
        && end > cells + 4
        && b[end..].iter().all(|&x| x == 0);
    if !shaped {
        return None;
    }
    let mut out = Vec::with_capacity(HEAD + end - cells);
    out.extend_from_slice(&b[..8]);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&b[cells..end]);
    Some(out)
}

/// A state of one stream as one of `n_stream` streams: its cells in the
/// first stream, the others empty (llama.cpp reads a stream's cells into
/// the target sequence's own stream, whichever it was written from).
pub(crate) fn widen(b: &[u8], n_stream: u32) -> Option<Vec<u8>> {
    if word(b, 8) != Some(1) {
        return None;
    }
    let mut out = Vec::with_capacity(b.len() + 4 * n_stream as usize);
    out.extend_from_slice(&b[..8]);
    out.extend_from_slice(&n_stream.to_le_bytes());
    out.extend_from_slice(&b[HEAD..]);
    out.resize(out.len() + 4 * (n_stream as usize - 1), 0);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state of `n` streams with `cells` in stream `s`.
    fn state(n: u32, s: u32, cells: &[u8]) -> Vec<u8> {
        let mut b = vec![0xd8, 0x3c, 0x14, 0xaf, s as u8, 0, 0, 0];
        b.extend_from_slice(&n.to_le_bytes());
        for i in 0..n {
            match i == s {
                true => b.extend_from_slice(cells),
                false => b.extend_from_slice(&[0; 4]),
            }
        }
        b
    }

    #[test]
    fn a_state_narrows_to_one_stream_and_widens_back() {
        // 2 cells, then bytes of cells that end in zeros.
        let cells = [2, 0, 0, 0, 7, 7, 0, 0];
        let one = state(1, 0, &cells);
        for (n, s) in [(1, 0), (2, 0), (2, 1), (4, 2)] {
            let b = state(n, s, &cells);
            let narrowed = narrow(&b, n, s).unwrap();
            assert_eq!(narrowed[8..], one[8..], "{n} streams, cells in {s}");
            assert_eq!(widen(&narrowed, n).unwrap()[8..], state(n, 0, &cells)[8..]);
        }
    }

    #[test]
    fn another_shape_is_not_narrowed_nor_widened() {
        let cells = [2, 0, 0, 0, 7, 7, 0, 0];
        // Another stream count, the cells in another stream, no cells.
        assert_eq!(narrow(&state(2, 1, &cells), 3, 1), None);
        assert_eq!(narrow(&state(2, 1, &cells), 2, 0), None);
        assert_eq!(narrow(&state(2, 1, &[0; 4]), 2, 1), None);
        assert_eq!(narrow(&[0; 6], 2, 1), None);
        assert_eq!(widen(&state(2, 0, &cells), 2), None);
        assert_eq!(widen(&[1, 2], 2), None);
    }
}
