//! Files a user names (a trace to replay, a warm profile): opened without
//! blocking, so a FIFO or a device named by mistake is refused at once
//! instead of hanging in `open()` where no signal reaches the command.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `path` opened for reading when it is a regular file; a FIFO, a device or
/// a directory is an `InvalidInput` error saying so (O_NONBLOCK makes the
/// open itself return at once; it changes nothing for a regular file's reads).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if f.metadata()?.is_file() {
        return Ok(f);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        "not a regular file (a FIFO, a device or a directory): name a file",
    ))
}

/// The whole of a regular file (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_a_directory_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = read_regular(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file).unwrap(), b"abc");
    }
}
