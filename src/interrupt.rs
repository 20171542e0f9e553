//! SIGINT / SIGTERM: the first one asks generation to stop at the next token
//! boundary (the CSV gets an aborted trailer, BMOE_DONE says aborted=1, actors
//! are joined, the exit code is 130 or 143); a second one exits at once.

use std::sync::atomic::{AtomicI32, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if SIGNAL.swap(sig, Ordering::SeqCst) != 0 {
        // SAFETY: _exit is async-signal-safe; a second signal means "now".
        unsafe { libc::_exit(128 + sig) };
    }
}

/// Install the handlers (the binary calls this once at start).
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
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

/// The signal that asked to stop, if any.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The conventional exit code for a run stopped by `sig` (130 for SIGINT, 143 for SIGTERM).
pub fn exit_code(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}
