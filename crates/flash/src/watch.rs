//! Notice the model file changing under a running engine: replaced (the path
//! now names another inode) or truncated (shorter than at start). Checked by
//! the flash actor before it serves a demand, at most once per interval, so a
//! run stops with a clear error instead of mixing two files' weights or
//! reading past a new end.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::FlashError;

/// Default time between two checks (one `stat` each).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// The identity of the model file at start.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    interval: Duration,
    last: Option<Instant>,
}

impl FileWatch {
    /// Remember what `path` is now.
    pub fn new(path: &Path, interval: Duration) -> Result<Self, FlashError> {
        let m = std::fs::metadata(path).map_err(|source| FlashError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            interval,
            last: None,
        })
    }

    /// Compare the file with its identity at start (at most once per interval).
    pub fn check(&mut self) -> Result<(), FlashError> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.interval)
        {
            return Ok(());
        }
        self.last = Some(now);
        let changed = |what: String| FlashError::Changed {
            path: self.path.clone(),
            what,
        };
        match std::fs::metadata(&self.path) {
            Err(e) => Err(changed(format!("removed or made unreadable ({e})"))),
            Ok(m) if (m.dev(), m.ino()) != (self.dev, self.ino) => {
                Err(changed("replaced (the path names another file now)".into()))
            }
            Ok(m) if m.len() < self.len => Err(changed(format!(
                "truncated ({} -> {} bytes)",
                self.len,
                m.len()
            ))),
            Ok(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_replacement_truncation_and_removal_but_not_reads() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.gguf");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        let mut w = FileWatch::new(&p, Duration::ZERO).unwrap();
        w.check().unwrap();
        let _ = std::fs::read(&p).unwrap();
        w.check().unwrap();

        // Growing is harmless (the offsets read are still there).
        let f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.set_len(9000).unwrap();
        w.check().unwrap();

        f.set_len(4096).unwrap();
        let e = w.check().unwrap_err().to_string();
        assert!(e.contains("truncated (8192 -> 4096 bytes)"), "{e}");

        let mut w = FileWatch::new(&p, Duration::ZERO).unwrap();
        let other = dir.path().join("new.gguf");
        std::fs::write(&other, vec![1u8; 4096]).unwrap();
        std::fs::rename(&other, &p).unwrap();
        let e = w.check().unwrap_err().to_string();
        assert!(e.contains("replaced"), "{e}");
        assert!(e.contains("model.gguf"), "{e}");

        let mut w = FileWatch::new(&p, Duration::ZERO).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(w.check().unwrap_err().to_string().contains("removed"));
    }

    #[test]
    fn checks_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        std::fs::write(&p, [1u8; 10]).unwrap();
        let mut w = FileWatch::new(&p, Duration::from_secs(3600)).unwrap();
        w.check().unwrap();
        std::fs::remove_file(&p).unwrap();
        // Within the interval the (now stale) answer stands.
        w.check().unwrap();
    }
}
