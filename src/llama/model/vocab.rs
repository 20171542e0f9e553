//! The model's vocabulary: tokenizing text, and the bytes and special
//! tokens a token stands for.

use std::ffi::c_char;

use llama_cpp_sys_2 as sys;

use super::handle::Model;
use crate::llama::{batch::Token, error::LlamaError};

impl Model {
    /// End-of-generation token (EOS, EOT, `<|im_end|>`, ...).
    pub(crate) fn is_eog(&self, token: Token) -> bool {
        // Valid vocab pointer; any token id is accepted (out of range -> false/abort
        // is prevented by callers passing ids produced by this model).
        // SAFETY: as the comment above says.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Tokenize `text`. `add_special` adds BOS where the model wants it;
    /// `parse_special` turns control-token text (e.g. `<|im_start|>`) into tokens.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>, LlamaError> {
        let len = i32::try_from(text.len())
            .map_err(|_| LlamaError::Tokenize("text longer than 2 GiB".into()))?;
        let mut out: Vec<Token> = vec![0; text.len() + 8];
        for _ in 0..2 {
            // `text` is valid for `len` bytes (need not be NUL-terminated);
            // `out` is writable for `out.len()` tokens.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr() as *const c_char,
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            if n == i32::MIN {
                break;
            }
            out.resize((-n) as usize, 0);
        }
        Err(LlamaError::Tokenize("llama_tokenize failed".into()))
    }

    /// The bytes one token stands for (may be part of a UTF-8 sequence);
    /// a control token's text when `special`, else nothing.
    pub(crate) fn token_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        self.piece_bytes(token, special)
    }

    /// A token's bytes; `special`: control tokens as their text, not empty.
    fn piece_bytes(&self, token: Token, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        for _ in 0..2 {
            // `buf` is writable for `buf.len()` bytes; the call does not
            // write a terminator beyond that length.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
        Vec::new()
    }

    /// The text of the beginning- and end-of-sequence tokens (empty when the
    /// vocabulary has none), as chat templates name them.
    pub(crate) fn bos_eos_text(&self) -> (String, String) {
        // SAFETY: valid vocabulary; plain getters (-1 when the token is absent).
        let (bos, eos) = unsafe {
            (
                sys::llama_vocab_bos(self.vocab()),
                sys::llama_vocab_eos(self.vocab()),
            )
        };
        let text = |t: Token| {
            if t < 0 {
                String::new()
            } else {
                String::from_utf8_lossy(&self.piece_bytes(t, true)).into_owned()
            }
        };
        (text(bos), text(eos))
    }
}
