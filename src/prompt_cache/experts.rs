//! The expert slots a server held when it stopped, kept beside its prompt
//! cache so that the next start reads them back in the background: a
//! restored prefix then prefills its new tokens from an expert cache as warm
//! as the one the state was saved with, not from flash.
//!
//! One file per model at the cache directory's top (`experts-<id>.slots`,
//! where the entries' folders do not count it): magic, the model's identity
//! (the flash actor's hash of its files and expert map), the slots as
//! `(layer, expert)` pairs, a CRC-32. Another model's file is not read; a
//! damaged one is a warning and nothing is warmed.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::PromptCacheError;

const MAGIC: &[u8; 8] = b"BMOEXS01";
/// The most slots a file may name (a bound on what a damaged count asks for).
const MAX_SLOTS: usize = 1 << 24;

/// The expert slots of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertSet {
    /// The model's identity (the flash actor's `ModelShape::identity`).
    pub identity: u64,
    /// `(layer, expert)`, in the order to read them.
    pub slots: Vec<(u32, u32)>,
}

impl ExpertSet {
    /// Where the set of the model named `identity` lives under `root`.
    pub fn path_in(root: &Path, identity: u64) -> PathBuf {
        root.join(format!("experts-{identity:016x}.slots"))
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24 + 8 * self.slots.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.identity.to_le_bytes());
        b.extend_from_slice(&(self.slots.len() as u64).to_le_bytes());
        for (layer, expert) in &self.slots {
            b.extend_from_slice(&layer.to_le_bytes());
            b.extend_from_slice(&expert.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Result<Self, String> {
        let (body, crc) = b
            .split_at_checked(b.len().saturating_sub(4))
            .ok_or("empty")?;
        let crc = u32::from_le_bytes(crc.try_into().map_err(|_| "too short")?);
        if body.len() < 24 || &body[..8] != MAGIC {
            return Err("not an expert set".into());
        }
        if crc32fast::hash(body) != crc {
            return Err("checksum mismatch".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
        let (identity, n) = (u64_at(8), u64_at(16) as usize);
        if n > MAX_SLOTS || body.len() != 24 + 8 * n {
            return Err(format!("{n} slots in {} bytes", body.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap_or([0; 4]));
        let slots = (0..n)
            .map(|i| (u32_at(24 + 8 * i), u32_at(28 + 8 * i)))
            .collect();
        Ok(Self { identity, slots })
    }

    /// Write the set under `root` (beside its place, then renamed into it).
    pub fn write(&self, root: &Path) -> Result<PathBuf, PromptCacheError> {
        let path = Self::path_in(root, self.identity);
        super::owned::write_beside(&path, |f| f.write_all(&self.to_bytes()))
            .map_err(|e| PromptCacheError::io(&path, e))?;
        Ok(path)
    }

    /// The set of the model named `identity` under `root`; None when there
    /// is none.
    pub fn read(root: &Path, identity: u64) -> Result<Option<Self>, PromptCacheError> {
        let path = Self::path_in(root, identity);
        let bytes = match crate::user_file::read_regular(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PromptCacheError::io(&path, e)),
        };
        let corrupt = |detail| PromptCacheError::Corrupt {
            path: path.clone(),
            detail,
        };
        let set = Self::from_bytes(&bytes).map_err(corrupt)?;
        if set.identity != identity {
            return Err(PromptCacheError::Mismatch {
                path,
                detail: format!("another model (identity {:016x})", set.identity),
            });
        }
        Ok(Some(set))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> ExpertSet {
        ExpertSet {
            identity: 0xfeed_beef_0000_0001,
            slots: vec![(0, 3), (1, 0), (47, 127)],
        }
    }

    #[test]
    fn a_set_reads_back_as_written_and_none_when_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ExpertSet::read(dir.path(), 7).unwrap(), None);
        let path = set().write(dir.path()).unwrap();
        assert_eq!(path, ExpertSet::path_in(dir.path(), set().identity));
        assert_eq!(
            ExpertSet::read(dir.path(), set().identity).unwrap(),
            Some(set())
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
    }

    #[test]
    fn a_damaged_or_foreign_set_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = set().write(dir.path()).unwrap();
        let good = std::fs::read(&path).unwrap();
        for cut in [0, 3, 20, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            let e = ExpertSet::read(dir.path(), set().identity).unwrap_err();
            assert!(
                matches!(e, PromptCacheError::Corrupt { .. }),
                "cut {cut}: {e}"
            );
        }
        let mut flipped = good.clone();
        flipped[30] ^= 0x40;
        std::fs::write(&path, &flipped).unwrap();
        let e = ExpertSet::read(dir.path(), set().identity).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        // Another model's set under this model's name.
        let other = ExpertSet {
            identity: 9,
            ..set()
        };
        std::fs::write(&path, other.to_bytes()).unwrap();
        let e = ExpertSet::read(dir.path(), set().identity).unwrap_err();
        assert!(matches!(e, PromptCacheError::Mismatch { .. }), "{e}");
    }
}
