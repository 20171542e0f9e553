//! Writes to stdout and stderr that never panic. `print!`/`eprintln!` panic
//! when the stream is closed or full (`bmoe run | head -c 10`, `>/dev/full`,
//! a file size limit): here a failed stdout write is an error the caller
//! returns (and, during generation, a reason to stop at the next token), and
//! stderr is best effort (when it fails there is nowhere left to say so).

use std::io::Write;
use std::sync::OnceLock;

/// The first failed stdout write of the process, as text.
static STDOUT_FAILED: OnceLock<String> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
#[error(
    "writing to stdout failed: {0} (the reader closed the pipe, or the disk is full); \
     the output stopped there"
)]
pub struct StdoutError(String);

/// Write `s` to stdout and flush. On failure the error is remembered
/// ([`stdout_failed`]) and returned.
pub fn out(s: &str) -> Result<(), StdoutError> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes())
        .and_then(|_| o.flush())
        .map_err(|e| {
            let msg = e.to_string();
            let _ = STDOUT_FAILED.set(msg.clone());
            StdoutError(msg)
        })
}

/// The first failed stdout write, if any (generation stops at the next token).
pub fn stdout_failed() -> Option<StdoutError> {
    STDOUT_FAILED.get().map(|m| StdoutError(m.clone()))
}

/// One line on stderr, best effort (never a panic).
pub fn err_line(s: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(s.as_bytes()).and_then(|_| e.write_all(b"\n"));
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! say {
    () => {
        $crate::stdio::err_line("")
    };
    ($($t:tt)*) => {
        $crate::stdio::err_line(&format!($($t)*))
    };
}
