//! `rpc-server --cache DIR`: ggml's tensor cache, verified.
//!
//! ggml's server keeps each large weight a client sends in `DIR/<hash>`, the
//! hash being FNV-1a (64-bit) of the bytes written as 16 lowercase hex digits
//! (`ggml-rpc.cpp`: `fnv_hash`, `rpc_server::set_tensor`), and on a later load
//! serves a client that names that hash from the file, unchecked. It writes
//! the file in place (`std::ofstream`, no temporary, no error check), so a
//! server killed mid-write or a full disk leaves a short file under a good
//! name, and the next load computes with it: wrong text, exit 0.
//!
//! The write cannot be made atomic from bmoe's side (ggml owns it), so every
//! file is checked against its name instead: all of them when the server
//! starts ([`verify_dir`]), and each one written or changed while it serves
//! once its writer has closed it ([`watch`]). A file whose bytes do not hash
//! to its name is removed, with a line on stderr; the client then sends that
//! tensor again, as for a file never cached. What is left: a file damaged
//! while this server runs (a full disk) is served to a client that asks for
//! it within that second, before the check removes it.

use std::collections::HashMap;
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How often [`watch`] looks at the folder.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// A cache this large says that it is being checked (it takes seconds).
const SAY_CHECKING_BYTES: u64 = 1 << 30;
/// Bytes hashed per read.
const CHUNK_BYTES: usize = 1 << 20;

/// A cache folder that cannot serve as one.
#[derive(Debug, thiserror::Error)]
#[error("--cache {}: {reason}; give a folder this user can write (it is created if missing)", dir.display())]
pub struct CacheDirError {
    pub dir: PathBuf,
    pub reason: String,
}

/// Create `dir` if missing and check that it is a folder this process can
/// create files in (a probe file, removed again).
pub fn prepare(dir: &Path) -> Result<(), CacheDirError> {
    let fail = |reason: String| CacheDirError {
        dir: dir.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create it: {e}")))?;
    let meta = std::fs::metadata(dir).map_err(|e| fail(e.to_string()))?;
    if !meta.is_dir() {
        return Err(fail("not a folder".into()));
    }
    let probe = dir.join(format!(".bmoe-write-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| fail(format!("not writable (cannot create a file in it: {e})")))?;
    std::fs::remove_file(&probe).map_err(|e| fail(format!("cannot remove a file in it: {e}")))
}

/// The hash a cache file's name stands for (None for a file that is not
/// one of ggml's: anything but 16 lowercase hex digits).
pub fn name_hash(name: &str) -> Option<u64> {
    let hex = name.len() == 16 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    hex.then(|| u64::from_str_radix(name, 16).ok()).flatten()
}

/// FNV-1a (64-bit) of everything `r` reads, as ggml hashes a tensor.
pub fn content_hash(mut r: impl Read) -> std::io::Result<u64> {
    let mut h = fnv::FnvHasher::default();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.write(&buf[..n]);
    }
}

/// One cache file as last verified: its length and modification time.
type Stamp = (u64, Option<SystemTime>);

/// What [`verify_dir`] found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Files that match their name, with their stamps.
    pub good: HashMap<String, Stamp>,
    /// Bytes of the good files.
    pub good_bytes: u64,
    /// Files removed as damaged.
    pub removed: usize,
}

/// The cache files (ggml's names) in `dir` with their stamps.
fn listing(dir: &Path) -> std::io::Result<Vec<(String, Stamp)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)?.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && name_hash(&name).is_some() {
            out.push((name, (meta.len(), meta.modified().ok())));
        }
    }
    Ok(out)
}

/// Check one file against its name; a damaged one is removed and said so.
/// True when it matches.
fn check(dir: &Path, name: &str) -> bool {
    let path = dir.join(name);
    let Some(want) = name_hash(name) else {
        return false;
    };
    let found = std::fs::File::open(&path).and_then(content_hash);
    let why = match found {
        Ok(h) if h == want => return true,
        Ok(h) => format!("its bytes hash to {h:016x}, not its name (cut short or overwritten)"),
        Err(e) => format!("it cannot be read ({e})"),
    };
    match std::fs::remove_file(&path) {
        Ok(()) => super::error::tell(format!(
            "rpc-server: removed the damaged cache file {}: {why}; a client sends that tensor \
             again",
            path.display()
        )),
        Err(e) => super::error::tell(format!(
            "rpc-server: the cache file {} is damaged ({why}) and could not be removed ({e}); \
             remove it, or restart without --cache",
            path.display()
        )),
    }
    false
}

/// Verify every cache file in `dir` on `threads` threads, removing the
/// damaged ones (each said on stderr).
pub fn verify_dir(dir: &Path, threads: usize) -> std::io::Result<Verified> {
    let files = listing(dir)?;
    let total_bytes: u64 = files.iter().map(|(_, (len, _))| len).sum();
    if total_bytes > SAY_CHECKING_BYTES {
        super::error::tell(format!(
            "rpc-server: checking {} cache files ({:.1} GiB) in {} against their hashes before \
             serving",
            files.len(),
            total_bytes as f64 / (1u64 << 30) as f64,
            dir.display()
        ));
    }
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Verified::default());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, files.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((name, stamp)) = files.get(i) else {
                    return;
                };
                let good = check(dir, name);
                let mut v = out.lock().unwrap_or_else(|p| p.into_inner());
                if good {
                    v.good.insert(name.clone(), *stamp);
                    v.good_bytes += stamp.0;
                } else {
                    v.removed += 1;
                }
            });
        }
    });
    Ok(out.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// Paths this process has open now (ggml's writer holds a cache file open
/// until it is complete).
fn open_paths() -> Vec<PathBuf> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect()
}

/// One look at `dir`: verify each cache file that is new or changed since
/// `known` and no longer open here; forget the ones that are gone.
pub fn recheck(dir: &Path, known: &mut HashMap<String, Stamp>) {
    let Ok(files) = listing(dir) else { return };
    known.retain(|name, _| files.iter().any(|(n, _)| n == name));
    let changed: Vec<_> = files
        .into_iter()
        .filter(|(name, stamp)| known.get(name) != Some(stamp))
        .collect();
    if changed.is_empty() {
        return;
    }
    let open = open_paths();
    for (name, stamp) in changed {
        if open.contains(&dir.join(&name)) {
            continue; // still being written: next look
        }
        if check(dir, &name) {
            known.insert(name, stamp);
        } else {
            known.remove(&name);
        }
    }
}

/// Keep verifying `dir` (canonical) while the server runs: each file ggml
/// writes, or anyone changes, is checked once closed, within about a second.
pub fn watch(dir: PathBuf, mut known: HashMap<String, Stamp>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rpc-cache-check".into())
        .spawn(move || loop {
            std::thread::sleep(WATCH_EVERY);
            recheck(&dir, &mut known);
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_ggmls_fnv1a() {
        // FNV-1a 64 test vectors (the offset basis for no bytes).
        assert_eq!(content_hash(&b""[..]).unwrap(), 0xcbf29ce484222325);
        assert_eq!(content_hash(&b"a"[..]).unwrap(), 0xaf63dc4c8601ec8c);
        assert_eq!(content_hash(&b"foobar"[..]).unwrap(), 0x85944171f73967e8);
    }

    #[test]
    fn only_ggmls_names_are_cache_files() {
        assert_eq!(name_hash("85944171f73967e8"), Some(0x85944171f73967e8));
        for other in [
            "85944171F73967E8",
            "85944171f73967e",
            "x5944171f73967e8",
            ".tmp",
            "",
        ] {
            assert_eq!(name_hash(other), None, "{other}");
        }
    }

    fn put(dir: &Path, bytes: &[u8]) -> String {
        let name = format!("{:016x}", content_hash(bytes).unwrap());
        std::fs::write(dir.join(&name), bytes).unwrap();
        name
    }

    #[test]
    fn damaged_files_are_removed_and_good_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let good = put(d.path(), &[1u8; 5000]);
        let short = put(d.path(), &[2u8; 5000]);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.path().join(&short))
            .unwrap();
        f.set_len(1000).unwrap();
        let scribbled = put(d.path(), &[3u8; 5000]);
        std::fs::write(d.path().join(&scribbled), [4u8; 5000]).unwrap();
        std::fs::write(d.path().join("notes.txt"), "not ggml's").unwrap();
        let v = verify_dir(d.path(), 2).unwrap();
        assert_eq!(v.removed, 2);
        assert_eq!(v.good.keys().collect::<Vec<_>>(), [&good]);
        assert_eq!(v.good_bytes, 5000);
        assert!(d.path().join(&good).exists());
        assert!(!d.path().join(&short).exists());
        assert!(!d.path().join(&scribbled).exists());
        assert!(d.path().join("notes.txt").exists());
    }

    #[test]
    fn a_file_damaged_while_serving_is_removed_at_the_next_look() {
        let d = tempfile::tempdir().unwrap();
        let name = put(d.path(), &[5u8; 3000]);
        let mut known = verify_dir(d.path(), 1).unwrap().good;
        recheck(d.path(), &mut known);
        assert!(d.path().join(&name).exists());
        std::fs::write(d.path().join(&name), [5u8; 100]).unwrap();
        recheck(d.path(), &mut known);
        assert!(!d.path().join(&name).exists());
        assert!(known.is_empty());
    }

    #[test]
    fn a_cache_dir_must_be_a_writable_folder() {
        let d = tempfile::tempdir().unwrap();
        prepare(&d.path().join("new/deeper")).unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = prepare(&file).unwrap_err();
        assert!(e.to_string().contains("--cache"), "{e}");
        if Path::new("/proc/1").is_dir() {
            let e = prepare(Path::new("/proc/1")).unwrap_err();
            assert!(e.to_string().contains("not writable"), "{e}");
        }
    }
}
