//! One-time backend initialisation and routing of llama.cpp's log into `tracing`.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use llama_cpp_sys_2 as sys;

static INIT: Once = Once::new();

/// Set when an abort callback stopped a graph (a signal, a client gone, the
/// engine's own stop): llama.cpp then logs its failed compute as errors,
/// which are bmoe's deliberate stop, not a crash. Cleared when a decode starts.
static STOPPED_ON_PURPOSE: AtomicBool = AtomicBool::new(false);

/// An abort callback is stopping the graph.
pub(crate) fn note_stop() {
    STOPPED_ON_PURPOSE.store(true, Ordering::Relaxed);
}

/// A decode is starting: llama.cpp's errors are errors again.
pub(crate) fn clear_stop() {
    STOPPED_ON_PURPOSE.store(false, Ordering::Relaxed);
}

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
        // After a stop bmoe asked for, llama.cpp's "compute failed" lines are
        // the stop itself: bmoe says what happened in its own words.
        sys::GGML_LOG_LEVEL_ERROR if STOPPED_ON_PURPOSE.load(Ordering::Relaxed) => {
            tracing::debug!(target: "llama.cpp", "(after a stop) {msg}")
        }
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{msg}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{msg}"),
        sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "llama.cpp", "{msg}"),
        _ => tracing::trace!(target: "llama.cpp", "{msg}"),
    }
}
