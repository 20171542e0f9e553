//! The model's chat template, and formatting a conversation with it.

use std::ffi::{c_char, CString};

use llama_cpp_sys_2 as sys;

use super::handle::Model;
use crate::llama::error::LlamaError;

/// One message of a chat, for [`Model::apply_builtin_template`].
#[derive(Debug, Clone)]
pub struct ChatMessage {
    pub(crate) role: String,
    pub(crate) content: String,
}

impl Model {
    /// The model's own chat template, if its gguf carries one.
    pub fn chat_template(&self) -> Option<String> {
        // Valid model; a null name asks for the default template. The
        // returned string is owned by the model.
        // SAFETY: as the comment above says.
        let p = unsafe { sys::llama_model_chat_template(self.ptr.as_ptr(), std::ptr::null()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, owned by the model for its lifetime.
        let name = unsafe { std::ffi::CStr::from_ptr(p) };
        Some(name.to_string_lossy().into_owned())
    }

    /// Format `messages` with llama.cpp's built-in chatml template (for a
    /// file that carries no template of its own), the assistant turn opened
    /// when `add_assistant`.
    pub(crate) fn apply_builtin_template(
        &self,
        messages: &[ChatMessage],
        add_assistant: bool,
    ) -> Result<String, LlamaError> {
        let ctmpl = c"chatml";
        let owned: Vec<(CString, CString)> = messages
            .iter()
            .map(|m| {
                Ok((
                    CString::new(m.role.as_str())?,
                    CString::new(m.content.as_str())?,
                ))
            })
            .collect::<Result<_, std::ffi::NulError>>()
            .map_err(|_| LlamaError::ChatTemplate("NUL byte in a chat message".into()))?;
        let msgs: Vec<sys::llama_chat_message> = owned
            .iter()
            .map(|(r, c)| sys::llama_chat_message {
                role: r.as_ptr(),
                content: c.as_ptr(),
            })
            .collect();
        let total: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        let mut buf = vec![0u8; 2 * total + 256];
        for _ in 0..2 {
            // `msgs` points into `owned`, alive for the call; `buf` is writable
            // for `buf.len()` bytes.
            // SAFETY: as the comment above says.
            let n = unsafe {
                sys::llama_chat_apply_template(
                    ctmpl.as_ptr(),
                    msgs.as_ptr(),
                    msgs.len(),
                    add_assistant,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                )
            };
            if n < 0 {
                return Err(LlamaError::ChatTemplate(
                    "llama.cpp does not support this model's chat template".into(),
                ));
            }
            if (n as usize) <= buf.len() {
                buf.truncate(n as usize);
                return String::from_utf8(buf).map_err(|_| {
                    LlamaError::ChatTemplate("template produced invalid UTF-8".into())
                });
            }
            buf.resize(n as usize, 0);
        }
        Err(LlamaError::ChatTemplate(
            "template output kept growing".into(),
        ))
    }
}
