//! Opening a model file for slice reads: O_DIRECT when asked and the
//! filesystem allows it, io_uring when the kernel does, and the note of a
//! fallback taken.

use std::path::{Path, PathBuf};

use super::error::FlashError;
use super::io::{open, PreadReader, SliceReader};
use super::uring::UringReader;

/// A fallback the reader took when it opened, for the run's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReaderNote {
    /// The filesystem refused O_DIRECT: reads go through the page cache.
    DirectRefused { path: PathBuf },
    /// io_uring could not be set up: reads are plain `pread`s.
    NoUring { error: String },
    /// `--inject-fault`: the reader fails on purpose, as the plan says.
    FaultInjection { plan: String },
}

impl std::fmt::Display for ReaderNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DirectRefused { path } => write!(
                f,
                "{}: the filesystem refuses O_DIRECT; reading through the page cache instead",
                path.display()
            ),
            Self::NoUring { error } => write!(f, "io_uring unavailable ({error}); using pread"),
            Self::FaultInjection { plan } => write!(f, "fault injection on ({plan})"),
        }
    }
}

/// Open `path` for slice reads: O_DIRECT when asked and the filesystem allows it
/// (with a note when it falls back), io_uring when the kernel allows it (else pread).
pub fn open_reader(
    path: &Path,
    want_direct: bool,
    queue_depth: u32,
    max_slice_bytes: u64,
) -> Result<(Box<dyn SliceReader>, Vec<ReaderNote>), FlashError> {
    let mut notes = Vec::new();
    let io_err = |source| FlashError::Open {
        path: path.to_path_buf(),
        source,
    };
    let (file, direct) = if want_direct {
        match open(path, true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                notes.push(ReaderNote::DirectRefused {
                    path: path.to_path_buf(),
                });
                (open(path, false).map_err(io_err)?, false)
            }
            Err(e) => return Err(io_err(e)),
        }
    } else {
        (open(path, false).map_err(io_err)?, false)
    };
    let depth = queue_depth.clamp(1, 256);
    match UringReader::new(file, path.to_path_buf(), direct, depth, max_slice_bytes) {
        Ok(r) => Ok((Box::new(r), notes)),
        Err((file, e)) => {
            notes.push(ReaderNote::NoUring {
                error: e.to_string(),
            });
            let pread = PreadReader::over(Box::new(file), path, direct, max_slice_bytes)?;
            Ok((Box::new(pread), notes))
        }
    }
}
