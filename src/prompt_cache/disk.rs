//! The disk tier: one file per entry under the ident's folder, named by a
//! hash of its tokens; an index of the files' tokens read from their heads
//! (refreshed from the directory, which other processes may write too); the
//! size cap over the cache's own entries in the directory (the folders it
//! marked, [`owned`]), the least recently used file (oldest mtime: a hit
//! touches it) out first. Nothing else in the directory is counted or removed.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::entry;
use super::hit::common_prefix;
use super::ident::{hex, Ident};
use super::owned::{self, Kind, EXT};
/// Distinct reasons a warning names, with a file each (the rest counted).
const WARN_EXAMPLES: usize = 3;
/// A temporary file this old was left by a process that died mid-write.
const STALE_TEMP: Duration = Duration::from_secs(600);

/// What the index knows of one file (tokens empty: never a candidate).
struct Indexed {
    len: u64,
    tokens: Vec<i32>,
}

pub(super) struct DiskIndex {
    dir: PathBuf,
    files: HashMap<PathBuf, Indexed>,
    /// Whether this index says when it finds damaged or foreign files (one
    /// of the two indexes over a folder does: the lookup's, not the writer's).
    warns: bool,
}

impl DiskIndex {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            files: HashMap::new(),
            warns: true,
        }
    }

    /// An index that never warns (the writer's: the lookup's says it).
    pub(super) fn quiet(dir: PathBuf) -> Self {
        Self {
            warns: false,
            ..Self::new(dir)
        }
    }

    /// The entry file for `tokens`.
    pub(super) fn path_of(&self, tokens: &[i32]) -> PathBuf {
        let mut h = Sha256::new();
        tokens.iter().for_each(|t| h.update(t.to_le_bytes()));
        self.dir.join(format!("{}.{EXT}", hex(&h.finalize()[..16])))
    }

    /// Re-read the directory: new or changed files' heads are read (the
    /// damaged or foreign ones said in one warning a refresh), gone ones
    /// dropped.
    pub(super) fn refresh(&mut self, want: &Ident) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut seen = HashMap::new();
        let mut refused: Vec<(PathBuf, String)> = Vec::new();
        let mut too_long = Vec::new();
        for e in rd.flatten() {
            if owned::kind_of(&e) != Some(Kind::Entry) {
                continue;
            }
            let path = e.path();
            let Ok(md) = e.metadata() else { continue };
            let len = md.len();
            let known = self.files.remove(&path).filter(|i| i.len == len);
            let tokens = match known {
                Some(i) => i.tokens,
                None => match head_tokens(&path, want) {
                    Ok(t) if want.fits(t.len()) => t,
                    Ok(t) => {
                        too_long.push(t.len());
                        Vec::new()
                    }
                    Err(why) => {
                        refused.push((path.clone(), why));
                        Vec::new()
                    }
                },
            };
            let i = Indexed { len, tokens };
            seen.insert(path, i);
        }
        self.files = seen;
        if self.warns {
            warn_refused(&self.dir, &refused);
            note_too_long(&self.dir, &too_long, want.n_ctx);
        }
    }

    /// The file sharing the longest prefix with `prompt`, longer than `floor`
    /// (never one whose tokens do not fit this context).
    pub(super) fn best(
        &mut self,
        prompt: &[i32],
        want: &Ident,
        floor: usize,
    ) -> Option<(PathBuf, usize)> {
        self.refresh(want);
        self.files
            .iter()
            .map(|(p, i)| (p, common_prefix(&i.tokens, prompt)))
            .filter(|&(_, c)| c > floor)
            .max_by_key(|&(_, c)| c)
            .map(|(p, c)| (p.clone(), c))
    }

    /// Whether an indexed entry's tokens start with `tokens`.
    pub(super) fn covers(&self, tokens: &[i32]) -> bool {
        self.files.values().any(|i| i.tokens.starts_with(tokens))
    }

    /// Remove the entries whose tokens `tokens` start with (shorter prefixes
    /// a new entry replaces).
    pub(super) fn remove_covered_by(&mut self, tokens: &[i32]) {
        self.files.retain(|p, i| {
            let covered = !i.tokens.is_empty() && tokens.starts_with(&i.tokens);
            if covered {
                let _ = std::fs::remove_file(p);
            }
            !covered
        });
    }

    /// Never offer `path` again (it was damaged or foreign when read whole).
    pub(super) fn forget(&mut self, path: &Path) {
        if let Some(i) = self.files.get_mut(path) {
            i.tokens.clear();
        }
    }

    #[cfg(test)]
    pub(super) fn knows(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
}

/// One warning for the files of `dir` a refresh refused (a file named for
/// each distinct reason, the first few; the rest counted).
fn warn_refused(dir: &Path, refused: &[(PathBuf, String)]) {
    if refused.is_empty() {
        return;
    }
    // One file for each distinct reason, the first few.
    let mut shown: Vec<String> = Vec::new();
    let mut reasons: Vec<&str> = Vec::new();
    for (p, why) in refused {
        if reasons.len() < WARN_EXAMPLES && !reasons.contains(&why.as_str()) {
            reasons.push(why);
            shown.push(format!("{}: {why}", p.display()));
        }
    }
    tracing::warn!(
        "prompt cache: {} file(s) in {} ignored, damaged or written for another model, \
             context or bmoe ({}{})",
        refused.len(),
        dir.display(),
        shown.join("; "),
        if refused.len() > shown.len() {
            "; ..."
        } else {
            ""
        }
    );
}

/// One line for the entries of `dir` holding more tokens than a sequence of
/// this context (written with a larger `-c`): skipped, not an error.
fn note_too_long(dir: &Path, lens: &[usize], n_ctx: u32) {
    if let Some(longest) = lens.iter().max() {
        tracing::info!(
            "prompt cache: {} {} in {} more tokens than this context's {n_ctx} per \
             sequence (up to {longest}, written with a larger -c): skipped",
            lens.len(),
            if lens.len() == 1 {
                "entry holds"
            } else {
                "entries hold"
            },
            dir.display()
        );
    }
}

/// The tokens in the head of `path`, or why it is not one of this ident's
/// entries (damaged, or written for another ident).
fn head_tokens(path: &Path, want: &Ident) -> Result<Vec<i32>, String> {
    let (ident, tokens) = crate::user_file::open_regular(path)
        .map_err(|e| e.to_string())
        .and_then(|f| entry::read_head(&mut BufReader::new(f)))
        .map_err(|d| format!("damaged: {d}"))?;
    match want.differs(&ident) {
        None => Ok(tokens),
        Some(d) => Err(format!("written for {d}")),
    }
}

/// Mark `path` as just used (its mtime is the LRU order; best effort).
pub(super) fn touch(path: &Path) {
    if let Ok(f) = crate::user_file::open_regular(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// One file under the cache directory.
struct Held {
    path: PathBuf,
    bytes: u64,
    modified: SystemTime,
    temp: bool,
}

/// The cache's own files in the folders it marked under `root` (stale
/// temporary files removed); nothing else is listed.
fn held_files(root: &Path) -> Vec<Held> {
    let now = SystemTime::now();
    let folders = owned::folders(root);
    let files = folders
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten());
    let mut held = Vec::new();
    for f in files {
        let Some(kind) = owned::kind_of(&f) else {
            continue;
        };
        let Ok(md) = f.metadata() else { continue };
        let modified = md.modified().unwrap_or(now);
        let temp = kind == Kind::Temp;
        let age = now.duration_since(modified).unwrap_or_default();
        if temp && age > STALE_TEMP && std::fs::remove_file(f.path()).is_ok() {
            continue;
        }
        held.push(Held {
            path: f.path(),
            bytes: md.len(),
            modified,
            temp,
        });
    }
    held
}

/// Make room for `incoming` bytes under `cap_bytes` in `root`, removing the
/// least recently used entries (any model's, never another file) first; false when it cannot
/// fit (bigger than the cap, or other processes' temporary files in the way).
pub(super) fn make_room(root: &Path, cap_bytes: u64, incoming: u64) -> bool {
    if incoming > cap_bytes {
        return false;
    }
    let mut held = held_files(root);
    let mut total: u64 = held.iter().map(|h| h.bytes).sum();
    held.retain(|h| !h.temp);
    held.sort_by_key(|h| h.modified);
    for h in held {
        if total + incoming <= cap_bytes {
            break;
        }
        if std::fs::remove_file(&h.path).is_ok() {
            total = total.saturating_sub(h.bytes);
        }
    }
    total + incoming <= cap_bytes
}

/// Bytes of the cache's own files under a cache directory `root`.
pub fn dir_bytes(root: &Path) -> u64 {
    held_files(root).iter().map(|h| h.bytes).sum()
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
