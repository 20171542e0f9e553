//! SIGINT / SIGTERM / SIGHUP: the first one asks generation to stop at the next token
//! boundary (the CSV gets an aborted trailer, BMOE_DONE says aborted=1, actors
//! are joined, the exit code is 130, 143 or 129); a second one exits at once, after
//! moving the outputs written so far (CSV, trace) into place.
//!
//! SIGBUS: touching a mapped page past the end of a file that shrank (the model
//! truncated while running, with the dense weights left in llama.cpp's
//! mapping) would otherwise kill the process with a bare "Bus error" and a
//! core dump; the handler says what most likely happened and exits 1.

use std::sync::atomic::{AtomicI32, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if SIGNAL.swap(sig, Ordering::SeqCst) != 0 {
        // What the outputs hold so far goes into place (rename(2) only).
        bmoe_output::commit_all_from_signal_handler();
        // SAFETY: _exit is async-signal-safe; a second signal means "now".
        unsafe { libc::_exit(128 + sig) };
    }
}

/// What the SIGBUS handler writes (a static byte string: no allocation in the handler).
const SIGBUS_MESSAGE: &[u8] =
    b"\nerror: bus error (SIGBUS) reading mapped memory: the model file was most \
likely truncated or overwritten while running; the run stopped (restart bmoe; \
--dense-weights anon keeps the dense weights out of the file mapping)\n";

extern "C" fn on_sigbus(_sig: libc::c_int) {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is a
    // static byte string valid for its whole length.
    unsafe {
        libc::write(2, SIGBUS_MESSAGE.as_ptr().cast(), SIGBUS_MESSAGE.len());
    }
    // The CSV rows written so far go into place (rename(2) only).
    bmoe_output::commit_all_from_signal_handler();
    // SAFETY: async-signal-safe.
    unsafe { libc::_exit(1) };
}

/// Install the handlers (the binary calls this once at start).
pub fn install() {
    // SAFETY: a zeroed sigaction with a plain handler that only calls
    // async-signal-safe functions (write, _exit).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
    // A file size limit (ulimit -f) makes writes fail with EFBIG, handled like
    // any failed write, instead of killing the process without a word.
    // SAFETY: setting a signal's disposition to ignore touches no memory.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // SIGHUP (the terminal closed) stops like SIGTERM: the CSV keeps its trailer.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a plain handler that only touches an
        // atomic and calls _exit, both async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal that asked to stop, if any, cleared: an interactive command
/// (`bmoe chat`) stops the reply on Ctrl-C and goes on, so the next signal
/// again asks to stop rather than exiting at once.
pub fn take() -> Option<i32> {
    match SIGNAL.swap(0, Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The signal that asked to stop, if any.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The conventional exit code for a run stopped by `sig` (130 for SIGINT, 143
/// for SIGTERM, 129 for SIGHUP).
pub fn exit_code(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}
