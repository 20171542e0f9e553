//! The two tiers (RAM, disk) and the background writer behind one lookup
//! and one insert.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::entry::{read_entry, Entry};
use super::error::PromptCacheError;
use super::hit::{Hit, Stats};
use super::ident::Ident;
use super::{disk, owned, ram, writer};

/// Damaged files tried, best first, before a lookup gives up on the disk.
const MAX_DISK_TRIES: usize = 4;

/// Where and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The cache directory (None: RAM only).
    pub dir: Option<PathBuf>,
    /// The most bytes the directory may hold (every model's entries together).
    pub disk_cap_bytes: u64,
    /// The most bytes of state kept in RAM.
    pub ram_bytes: u64,
}

/// The two tiers and the writer. Entries are kept per scope (serve's
/// tenants: 0 when everyone shares): a lookup never sees another scope's.
pub struct PromptCache {
    ident: Ident,
    ram: ram::RamTier,
    /// The cache directory (None: RAM only).
    root: Option<PathBuf>,
    /// Each scope's disk index, made on its first use.
    disks: HashMap<u64, disk::DiskIndex>,
    writer: Option<writer::Writer>,
    stats: Arc<Stats>,
}

/// The folder of `ident`'s entries of `scope` under the cache directory.
fn folder_of(ident: &Ident, scope: u64) -> String {
    match scope {
        0 => ident.folder(),
        s => format!("{}-{s:016x}", ident.folder()),
    }
}

impl PromptCache {
    /// Open the cache for entries of `ident` (the shared scope's folder is
    /// made and marked if missing; the writer thread started).
    pub fn open(cfg: &Config, ident: Ident) -> Result<Self, PromptCacheError> {
        let stats = Arc::new(Stats::default());
        let writer = match &cfg.dir {
            Some(root) => {
                let dir = root.join(folder_of(&ident, 0));
                owned::make_folder(&dir).map_err(|e| PromptCacheError::io(&dir, e))?;
                let w = writer::Writer::start(root.clone(), cfg.disk_cap_bytes)
                    .map_err(|e| PromptCacheError::io(root, e))?;
                Some(w)
            }
            None => None,
        };
        Ok(Self {
            ident,
            ram: ram::RamTier::new(cfg.ram_bytes),
            root: cfg.dir.clone(),
            disks: HashMap::new(),
            writer,
            stats,
        })
    }

    /// The disk index of `scope` (None: RAM only).
    fn disk(&mut self, scope: u64) -> Option<&mut disk::DiskIndex> {
        let (root, ident) = (self.root.as_ref()?, &self.ident);
        Some(
            self.disks
                .entry(scope)
                .or_insert_with(|| disk::DiskIndex::new(root.join(folder_of(ident, scope)))),
        )
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The entry of `scope` sharing the longest prefix with `prompt`, when
    /// that prefix is longer than `held` (what the sequence already holds)
    /// and at least `min_tokens`; RAM first, then disk (a damaged or foreign
    /// file is warned about and skipped). Another scope's entries are never
    /// looked at.
    pub fn lookup(
        &mut self,
        scope: u64,
        prompt: &[i32],
        held: usize,
        min_tokens: usize,
    ) -> Option<Hit> {
        let floor = held.max(min_tokens.saturating_sub(1));
        let in_ram = self.ram.best(scope, prompt).filter(|h| h.common > floor);
        let best_ram = in_ram.as_ref().map_or(floor, |h| h.common);
        // A damaged or foreign file is warned about and the next best tried.
        let ident = self.ident.clone();
        for _ in 0..MAX_DISK_TRIES {
            let Some((path, common)) = self
                .disk(scope)
                .and_then(|d| d.best(prompt, &ident, best_ram))
            else {
                break;
            };
            match read_entry(&path, &ident) {
                Ok(e) => return Some(self.promoted(scope, &path, e, common)),
                Err(e) => {
                    tracing::warn!("{e}; the prompt is prefilled instead");
                    if let Some(d) = self.disk(scope) {
                        d.forget(&path);
                    }
                }
            }
        }
        in_ram
    }

    /// A disk entry read for a hit: counted, touched, kept in RAM too.
    fn promoted(&mut self, scope: u64, path: &Path, e: Entry, common: usize) -> Hit {
        self.stats
            .read_bytes
            .fetch_add(e.state.len() as u64, Ordering::Relaxed);
        disk::touch(path);
        let hit = Hit {
            tokens: e.tokens.into(),
            state: Arc::new(e.state),
            common,
        };
        self.ram
            .insert(scope, hit.tokens.clone(), hit.state.clone());
        hit
    }

    /// Keep the state of a sequence holding `tokens`, for `scope`: in RAM
    /// now, on disk by the writer (dropped with a note when its queue is
    /// full: never waits).
    pub fn save(&mut self, scope: u64, tokens: Vec<i32>, state: Vec<u8>) {
        let tokens: Arc<[i32]> = tokens.into();
        let state = Arc::new(state);
        self.ram.insert(scope, tokens.clone(), state.clone());
        let dir = self
            .root
            .as_ref()
            .map(|r| r.join(folder_of(&self.ident, scope)));
        if let (Some(w), Some(dir)) = (&self.writer, dir) {
            let job = writer::WriteJob {
                ident: self.ident.clone(),
                dir,
                tokens,
                state,
                stats: self.stats.clone(),
            };
            w.submit(job);
        }
    }

    /// Stop the writer: the shutdown message, then its join within
    /// `deadline` (false: it did not end in time and is left detached).
    pub fn close(self, deadline: Duration) -> bool {
        self.writer.is_none_or(|w| w.stop(deadline))
    }
}
