//! `--cache-warm`: find this model's warm-start profile, have the flash actor
//! read its hottest slots while the prompt is prefilled, and fold this run's
//! routing back into the profile at the end (the profile format and plan are
//! `bmoe_flash::warm_profile`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use bmoe_flash::cache::SlotKey;
use bmoe_flash::warm_profile::{
    fnv1a64, ModelShape, WarmError, WarmProfile, FNV_SEED, MATURE_TOKENS,
};
use bmoe_flash::FlashCounters;
use bmoe_output::PendingFile;

use super::error::StreamError;
use crate::layout::MoeLayout;

const MIB: f64 = 1024.0 * 1024.0;
/// Bytes of each file's start hashed into the identity (the header's
/// metadata and the start of its tensor table).
const HEADER_HASH_BYTES: u64 = 64 * 1024;
/// A run that decoded fewer tokens than this leaves the profile as it was.
pub(crate) const MIN_SAVE_TOKENS: f64 = 8.0;

/// `--cache-warm`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WarmSource {
    #[default]
    Off,
    /// The profile kept for this model in the cache directory.
    Auto,
    /// This file (created when missing; refused when it is another model's).
    File(PathBuf),
}

/// As `--cache-warm` takes it (`--help` shows the default so).
impl std::fmt::Display for WarmSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WarmSource::Off => f.write_str("off"),
            WarmSource::Auto => f.write_str("auto"),
            WarmSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl std::str::FromStr for WarmSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(WarmSource::Off),
            "auto" => Ok(WarmSource::Auto),
            "" => Err("expected auto, off or a profile file".into()),
            p => Ok(WarmSource::File(PathBuf::from(p))),
        }
    }
}

/// The model's shape as the flash actor counts it, and its identity: a hash
/// of every file's size and first bytes, and of the expert map.
pub(crate) fn model_shape(layout: &MoeLayout, k: u32) -> Result<ModelShape, StreamError> {
    let n_layer = layout
        .experts
        .iter()
        .map(|e| e.layer as usize + 1)
        .max()
        .unwrap_or(0);
    let mut slot_bytes = vec![0u64; n_layer];
    let mut n_expert = 0;
    let mut h = FNV_SEED;
    for e in &layout.experts {
        slot_bytes[e.layer as usize] += e.slice_bytes;
        n_expert = n_expert.max(e.n_expert);
        for v in [
            u64::from(e.layer),
            e.proj as u64,
            e.file_offset,
            e.slice_bytes,
            u64::from(e.n_expert),
        ] {
            h = fnv1a64(h, &v.to_le_bytes());
        }
    }
    for s in &layout.shards {
        let mut head = Vec::new();
        std::fs::File::open(&s.path)
            .and_then(|f| f.take(HEADER_HASH_BYTES).read_to_end(&mut head))
            .map_err(|source| StreamError::Io {
                what: format!("read {} for its identity", s.path.display()),
                source,
            })?;
        h = fnv1a64(h, &s.file_bytes.to_le_bytes());
        h = fnv1a64(h, &head);
    }
    Ok(ModelShape {
        n_expert,
        k,
        slot_bytes,
        identity: h,
    })
}

/// Where `auto` keeps the profile of `model`: `<cache dir>/warm/<stem>-<id8>.bmws`.
pub(crate) fn auto_path(model: &Path, identity: u64) -> Result<PathBuf, StreamError> {
    let dir = crate::fixture::cache_dir().map_err(|e| StreamError::Warm(e.to_string()))?;
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    Ok(dir
        .join("warm")
        .join(format!("{stem}-{:08x}.bmws", identity >> 32)))
}

/// What a profile gives a run: the slots to read, hottest first, and every
/// slot's routing rate (to seed the cache policy's counts).
#[derive(Debug, Default)]
pub(crate) struct WarmPlan {
    pub(crate) keys: Vec<SlotKey>,
    pub(crate) rates: Vec<(SlotKey, f32)>,
}

/// A run's warm start: where its profile lives, what was found there, and
/// what was planned from it.
#[derive(Debug)]
pub struct WarmSession {
    path: PathBuf,
    shape: ModelShape,
    /// The profile this run's counts are merged into (empty when none was usable).
    prior: WarmProfile,
    /// What was found, in words (the summary says it).
    found: String,
    planned_slots: u64,
    planned_bytes: u64,
}

impl WarmSession {
    /// Find the profile for `source`; plan its slots within `budget_bytes`.
    /// `auto` never fails on a bad or foreign profile (it is set aside and
    /// replaced at the end); a named file does.
    pub(crate) fn open(
        source: &WarmSource,
        model: &Path,
        shape: ModelShape,
        budget_bytes: u64,
    ) -> Result<Option<(Self, WarmPlan)>, StreamError> {
        let (path, strict) = match source {
            WarmSource::Off => return Ok(None),
            WarmSource::Auto => (auto_path(model, shape.identity)?, false),
            WarmSource::File(p) => (p.clone(), true),
        };
        let (prior, found) = match crate::user_file::read_regular(&path) {
            Ok(bytes) => match WarmProfile::for_model(&bytes, &shape) {
                Ok(p) => {
                    let found = format!("profile of {:.0} tokens over {} run(s)", p.tokens, p.runs);
                    (p, found)
                }
                Err(e) if strict => return Err(refused(&path, e)),
                Err(e) => (
                    WarmProfile::empty(shape.clone()),
                    format!("profile set aside ({e}); this run's replaces it"),
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                WarmProfile::empty(shape.clone()),
                "no profile yet; this run's is saved".into(),
            ),
            Err(e) if strict => {
                return Err(StreamError::Warm(format!(
                    "{}: cannot read it ({e}); name a profile file (created when missing) or use \
                     --cache-warm auto",
                    path.display()
                )))
            }
            Err(e) => (
                WarmProfile::empty(shape.clone()),
                format!("profile not read ({e}); this run's replaces it"),
            ),
        };
        let (keys, rates) = if prior.is_mature() {
            (prior.plan(budget_bytes), prior.rates())
        } else {
            (Vec::new(), Vec::new())
        };
        let found = if prior.tokens > 0.0 && !prior.is_mature() {
            format!("{found}, too young to use (under {MATURE_TOKENS:.0} tokens)")
        } else {
            found
        };
        let planned_bytes = keys
            .iter()
            .map(|k| shape.slot_bytes[k.layer as usize])
            .sum();
        let session = Self {
            path,
            shape,
            prior,
            found,
            planned_slots: keys.len() as u64,
            planned_bytes,
        };
        Ok(Some((session, WarmPlan { keys, rates })))
    }

    /// The summary line: what was found, planned, read and used.
    pub(crate) fn line(&self, c: &FlashCounters) -> String {
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let read = ld(&c.warm.read_slots);
        let used = ld(&c.warm.used_slots);
        format!(
            "moe-cache-warm: {} ({}): planned {} slots {:.1} MiB, read {} ({:.1} MiB), used {} of {} \
             ({:.0}%), skipped {} (resident first or no room)",
            self.path.display(),
            self.found,
            self.planned_slots,
            self.planned_bytes as f64 / MIB,
            read,
            ld(&c.warm.read_bytes) as f64 / MIB,
            used,
            read,
            if read > 0 {
                used as f64 * 100.0 / read as f64
            } else {
                0.0
            },
            ld(&c.warm.skipped_slots),
        )
    }

    /// Fold this run's single-token routing into the profile and write it
    /// (temp file, then rename). Returns what happened, in words.
    pub(crate) fn save(&self, c: &FlashCounters) -> Result<String, StreamError> {
        let run = c.decode_uses.snapshot();
        let tokens = bmoe_flash::warm_profile::run_tokens(&self.shape, &run);
        if run.len() != self.prior.counts.len() {
            return Ok("profile not saved: the counts do not match the model's shape".into());
        }
        if tokens < MIN_SAVE_TOKENS {
            return Ok(format!(
                "profile not saved: {tokens:.0} tokens decoded, under {MIN_SAVE_TOKENS:.0}"
            ));
        }
        let mut p = self.prior.clone();
        p.merge_run(&run);
        let io = |what: &str, source| StreamError::Io {
            what: format!("--cache-warm: {what} {}", self.path.display()),
            source,
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("create the folder of", e))?;
        }
        let (mut file, pending) =
            PendingFile::create_whole_or_nothing(&self.path).map_err(|e| io("write", e))?;
        std::io::Write::write_all(&mut file, &p.to_bytes()).map_err(|e| io("write", e))?;
        drop(file);
        pending.commit().map_err(|e| io("write", e))?;
        Ok(format!(
            "profile saved: {:.0} tokens over {} run(s) -> {}",
            p.tokens,
            p.runs,
            self.path.display()
        ))
    }
}

fn refused(path: &Path, e: WarmError) -> StreamError {
    StreamError::Warm(format!(
        "{}: {e}; name another file, use --cache-warm auto, or delete it",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!("off".parse::<WarmSource>(), Ok(WarmSource::Off));
        assert_eq!("auto".parse::<WarmSource>(), Ok(WarmSource::Auto));
        assert_eq!(
            "x.bmws".parse::<WarmSource>(),
            Ok(WarmSource::File("x.bmws".into()))
        );
        assert!("".parse::<WarmSource>().is_err());
    }
}
