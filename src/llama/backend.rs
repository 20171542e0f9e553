//! One-time backend initialisation and routing of llama.cpp's log into `tracing`.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

use llama_cpp_sys_2 as sys;

static INIT: Once = Once::new();

/// Initialise llama.cpp's backends once per process and route its log output
/// into `tracing` (target `llama.cpp`). Safe to call any number of times.
pub(crate) fn init_backend() {
    INIT.call_once(|| {
        // SAFETY: `log_to_tracing` is a plain `extern "C"` function that lives for
        // the whole program and does not use `user_data`; llama.cpp stores the
        // pointer and calls it from any thread, which `tracing` macros allow.
        unsafe { sys::llama_log_set(Some(log_to_tracing), std::ptr::null_mut()) };
        // SAFETY: called exactly once (guarded by `Once`) before any model or
        // context is created, as llama.h requires.
        unsafe { sys::llama_backend_init() };
    });
}

unsafe extern "C" fn log_to_tracing(
    level: sys::ggml_log_level,
    text: *const c_char,
    _: *mut c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() || msg == "." {
        return;
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{msg}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{msg}"),
        sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "llama.cpp", "{msg}"),
        _ => tracing::trace!(target: "llama.cpp", "{msg}"),
    }
}
