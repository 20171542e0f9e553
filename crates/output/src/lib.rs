//! Output files (the CSV, the Chrome trace) written under a temporary name
//! beside their target and renamed into place when complete: a run that fails
//! before it measured anything, or is refused, never truncates the file that
//! was there, and two runs never interleave their bytes in one file.

use std::ffi::{c_char, CString};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// Pending files a process may have open at once (the CSV and the trace).
const MAX_PENDING: usize = 8;

/// (temporary, target) paths of the pending files, as leaked C strings, for
/// [`commit_all_from_signal_handler`]; null where free.
static REGISTRY: [[AtomicPtr<c_char>; 2]; MAX_PENDING] = [const {
    [
        const { AtomicPtr::new(std::ptr::null_mut()) },
        const { AtomicPtr::new(std::ptr::null_mut()) },
    ]
}; MAX_PENDING];

/// Per slot: whether a hard exit moves the file into place (true: a CSV or a
/// trace, whose rows so far are worth keeping) or removes it (false: a file
/// that is only useful whole, such as a fixture model).
static KEEP_ON_EXIT: [AtomicBool; MAX_PENDING] = [const { AtomicBool::new(true) }; MAX_PENDING];

fn c_path(p: &Path) -> *mut c_char {
    CString::new(p.as_os_str().as_bytes())
        .map(CString::into_raw)
        .unwrap_or(std::ptr::null_mut())
}

/// Register a pending file; returns its registry slot (None when full or
/// when a path holds a NUL byte: it is then not moved from a signal handler).
fn register(tmp: &Path, target: &Path, keep: bool) -> Option<usize> {
    let (t, g) = (c_path(tmp), c_path(target));
    if t.is_null() || g.is_null() {
        free(t);
        free(g);
        return None;
    }
    for (i, slot) in REGISTRY.iter().enumerate() {
        // The target first: a slot whose temporary path is set is complete.
        if slot[1]
            .compare_exchange(std::ptr::null_mut(), g, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            KEEP_ON_EXIT[i].store(keep, Ordering::Release);
            slot[0].store(t, Ordering::Release);
            return Some(i);
        }
    }
    free(t);
    free(g);
    None
}

fn unregister(i: usize) {
    let t = REGISTRY[i][0].swap(std::ptr::null_mut(), Ordering::AcqRel);
    let g = REGISTRY[i][1].swap(std::ptr::null_mut(), Ordering::AcqRel);
    free(t);
    free(g);
}

fn free(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: made by CString::into_raw in `c_path`, freed once (the
        // registry slot was swapped to null before).
        drop(unsafe { CString::from_raw(p) });
    }
}

/// Move every pending file into place now (or remove it, for a whole-or-nothing
/// file): for a process about to `_exit` from a signal handler (a second
/// SIGINT, SIGBUS), so what was written is not lost and nothing half-built is
/// left behind. Async-signal-safe: atomic loads, rename(2) and unlink(2) only.
pub fn commit_all_from_signal_handler() {
    for i in 0..MAX_PENDING {
        exit_slot(i);
    }
}

/// What a hard exit does to the file in registry slot `i` (async-signal-safe).
fn exit_slot(i: usize) {
    let t = REGISTRY[i][0].load(Ordering::Acquire);
    let g = REGISTRY[i][1].load(Ordering::Acquire);
    if t.is_null() || g.is_null() {
        return;
    }
    // SAFETY: both are NUL-terminated strings leaked until unregister (which a
    // handler-interrupted thread cannot finish meanwhile: at worst it already
    // nulled them, and then we skip the slot).
    unsafe {
        if KEEP_ON_EXIT[i].load(Ordering::Acquire) {
            libc::rename(t, g);
        } else {
            libc::unlink(t);
        }
    }
}

/// A file being written as `.<name>.bmoe-<pid>.partial` beside `target`.
/// [`PendingFile::commit`] renames it over the target; dropped uncommitted,
/// it is removed and the target stays as it was.
#[derive(Debug)]
pub struct PendingFile {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
    /// Its slot in the signal handler's registry.
    slot: Option<usize>,
}

impl PendingFile {
    /// Create the temporary file (the target's directory must be writable;
    /// the target itself is not touched). A target that is a directory is
    /// refused here rather than after the run.
    pub fn create(target: &Path) -> std::io::Result<(File, Self)> {
        Self::create_as(target, true)
    }

    /// [`PendingFile::create`] for a file that is only useful whole (a model
    /// being built): a hard exit from a signal handler removes it instead of
    /// moving it into place.
    pub fn create_whole_or_nothing(target: &Path) -> std::io::Result<(File, Self)> {
        Self::create_as(target, false)
    }

    fn create_as(target: &Path, keep_on_exit: bool) -> std::io::Result<(File, Self)> {
        match std::fs::metadata(target) {
            Ok(m) if m.is_dir() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "is a directory",
                ))
            }
            // A FIFO or a device would be replaced by a plain file at the end.
            Ok(m) if !m.is_file() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "is not a regular file (a FIFO or a device); give the path of a file",
                ))
            }
            _ => {}
        }
        let name = target
            .file_name()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
        let tmp = target.with_file_name(format!(
            ".{}.bmoe-{}.partial",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        let pending = Self {
            slot: register(&tmp, target, keep_on_exit),
            tmp,
            target: target.to_path_buf(),
            committed: false,
        };
        Ok((file, pending))
    }

    /// Where the file ends up.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Move the finished file into place (atomically, on one filesystem).
    pub fn commit(mut self) -> std::io::Result<()> {
        std::fs::rename(&self.tmp, &self.target)?;
        self.committed = true;
        Ok(())
    }

    /// The temporary file being written (a run's CSV can be followed there).
    pub fn partial(&self) -> &Path {
        &self.tmp
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            unregister(i);
        }
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_changes_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("run.csv");
        std::fs::write(&target, "old").unwrap();
        let (mut f, p) = PendingFile::create(&target).unwrap();
        std::io::Write::write_all(&mut f, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        drop(p);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp removed"
        );
        let (mut f, p) = PendingFile::create(&target).unwrap();
        std::io::Write::write_all(&mut f, b"new").unwrap();
        p.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_hard_exit_keeps_rows_but_removes_a_half_built_file() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("run.csv");
        let model = dir.path().join("m.gguf");
        let (_, c) = PendingFile::create(&csv).unwrap();
        let (_, m) = PendingFile::create_whole_or_nothing(&model).unwrap();
        let m_tmp = m.partial().to_path_buf();
        assert!(m_tmp.exists());
        // Only this test's slots (other tests' pending files share the registry).
        for slot in [c.slot, m.slot] {
            exit_slot(slot.expect("registered"));
        }
        assert!(csv.exists(), "the CSV rows were moved into place");
        assert!(
            !model.exists() && !m_tmp.exists(),
            "the partial model was removed"
        );
        drop((c, m));
    }

    #[test]
    fn a_directory_or_missing_parent_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(PendingFile::create(dir.path()).is_err());
        assert!(PendingFile::create(&dir.path().join("no/such/x.csv")).is_err());
        let e = PendingFile::create(Path::new("/dev/null")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "a device");
    }
}
