//! What the prompt cache may touch under its directory: only folders it
//! made and marked (a marker file holding [`MARKER_TEXT`]), never through a
//! symlink, and in them only regular files named `*.bpc` that start with an
//! entry's magic (or its own temporary files). Everything else in the
//! directory, a user's documents or a model file, is left as it is: the
//! directory may be shared with other files.

use std::fs::DirEntry;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The first bytes of every entry file (`entry.rs` writes them).
pub const MAGIC: &[u8; 8] = b"BMOEPC\x00\x01";

/// The marker's file name in each folder the cache made.
pub(super) const MARKER: &str = "BMOE-PROMPT-CACHE";
/// The marker's content (read back to tell it from a file of the same name).
const MARKER_TEXT: &[u8] =
    b"bmoe prompt cache folder: bmoe removes only its own *.bpc entries here\n";
/// An entry file's extension.
pub(super) const EXT: &str = "bpc";
/// A temporary file's prefix (written, then renamed into place).
pub(super) const TEMP_PREFIX: &str = ".tmp-";

/// Make (or adopt) the cache's folder `dir` under `root`: created private
/// (0700) when missing, refused when it is a symlink or not a folder, and
/// marked as the cache's own.
pub(super) fn make_folder(dir: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() || !m.is_dir() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a symlink or not a folder: the prompt cache writes only in folders it made",
            ))
        }
        Ok(_) => {}
        Err(_) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?,
    }
    if !is_marked(dir) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(MARKER))?;
        f.write_all(MARKER_TEXT)?;
    }
    Ok(())
}

/// Whether `dir` is a folder the cache marked (a regular marker file, not
/// a symlink, with the marker's text).
pub(super) fn is_marked(dir: &Path) -> bool {
    let marker = dir.join(MARKER);
    let regular = std::fs::symlink_metadata(&marker).is_ok_and(|m| m.file_type().is_file());
    let mut text = Vec::new();
    regular
        && crate::user_file::open_regular(&marker)
            .and_then(|f| f.take(MARKER_TEXT.len() as u64 + 1).read_to_end(&mut text))
            .is_ok()
        && text == MARKER_TEXT
}

/// The folders under `root` that the cache marked (real folders, not
/// symlinks to one).
pub(super) fn folders(root: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(root).into_iter().flatten().flatten();
    entries
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| is_marked(p))
        .collect()
}

/// What one name in a marked folder is to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A regular `*.bpc` file with an entry's magic.
    Entry,
    /// The cache's own temporary file (`.tmp-*.bpc`, regular).
    Temp,
}

/// `e` as one of the cache's files, None for anything else (another
/// extension, a symlink, a FIFO, a device, a folder, a file without the
/// magic): such a file is never read whole, indexed or removed.
pub(super) fn kind_of(e: &DirEntry) -> Option<Kind> {
    if !e.file_type().is_ok_and(|t| t.is_file()) {
        return None;
    }
    let path = e.path();
    if path.extension().is_none_or(|x| x != EXT) {
        return None;
    }
    if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
        return Some(Kind::Temp);
    }
    has_magic(&path).then_some(Kind::Entry)
}

/// Whether the regular file at `path` starts with an entry's magic (opened
/// without blocking: a FIFO swapped in is refused, not waited on).
pub(super) fn has_magic(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    crate::user_file::open_regular(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == MAGIC)
}

/// Write `path` whole or not at all: `write` fills a file beside it, which
/// is synced and renamed into place (a failure removes it), so a reader, or
/// another server on the same directory, never sees half a file.
pub(crate) fn write_beside<T>(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let tmp = temp_beside(path);
    let written = (|| {
        let mut f = private_file(&tmp)?;
        let out = write(&mut f)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)?;
        Ok(out)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file readable by its owner only (0600: entries hold prompts),
/// never through a symlink planted at its name.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// A temporary name beside `path`, unique to this process and moment.
fn temp_beside(path: &Path) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        "{TEMP_PREFIX}{}-{nanos}-{name}",
        std::process::id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_real_folder_counts() {
        let root = tempfile::tempdir().unwrap();
        let ours = root.path().join("ours");
        make_folder(&ours).unwrap();
        std::fs::create_dir(root.path().join("theirs")).unwrap();
        std::fs::write(root.path().join("theirs").join(MARKER), b"not ours").unwrap();
        std::os::unix::fs::symlink(&ours, root.path().join("link")).unwrap();
        assert_eq!(folders(root.path()), vec![ours.clone()]);
        assert!(make_folder(&root.path().join("link")).is_err(), "a symlink");
        let mode = std::fs::metadata(&ours).unwrap().permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.mode() & 0o777, 0o700);
    }
}
