//! Models split over several files with llama.cpp's convention:
//! `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, ... Every shard
//! carries `split.no` (u16, 0-based), `split.count` (u16) and the first one
//! `split.tensors.count` (i32, the tensors of all shards); the metadata and the
//! vocabulary come from the first shard. llama.cpp, given the first shard,
//! finds the others by that name pattern; so does [`GgufShards::open`], which
//! checks them all before anything is loaded.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::file::{GgufFile, TensorInfo};
use crate::llama::error::LlamaError;

pub(crate) const KEY_NO: &str = "split.no";
pub(crate) const KEY_COUNT: &str = "split.count";
pub(crate) const KEY_TENSORS: &str = "split.tensors.count";

/// The file name of shard `no` (1-based) of `count`.
pub(crate) fn shard_name(prefix: &str, no: u32, count: u32) -> String {
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

/// `(prefix, no, count)` of a shard's path (`no` 1-based), when its name
/// follows the convention.
pub(crate) fn parse_shard_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.to_str()?.strip_suffix(".gguf")?;
    let (rest, count) = name.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix.to_string(), no.parse().ok()?, count.parse().ok()?))
}

/// A model's files, one or several shards, all checked: present, complete,
/// numbered in order and agreeing on their count and tensor total.
pub(crate) struct GgufShards {
    files: Vec<GgufFile>,
}

impl GgufShards {
    /// Open `path` and, when it is the first shard of a split model, the other
    /// shards next to it. The first shard's vocabulary is checked too.
    pub(crate) fn open(path: &Path) -> Result<Self, LlamaError> {
        let first = GgufFile::open(path)?;
        first.check_vocab()?;
        first.check_complete()?;
        let count = split_int(&first, KEY_COUNT).unwrap_or(0);
        if count <= 1 {
            return Ok(Self { files: vec![first] });
        }
        let mismatch = |detail: String| LlamaError::ShardMismatch {
            path: path.to_path_buf(),
            detail,
        };
        let no = split_int(&first, KEY_NO).unwrap_or(0);
        let Some((prefix, 1, named)) = parse_shard_name(path) else {
            return Err(mismatch(format!(
                "is shard {} of a model split in {count}; give the first shard, named \
                 PREFIX-00001-of-{count:05}.gguf",
                no + 1
            )));
        };
        if no != 0 || named != count {
            return Err(mismatch(format!(
                "its header says shard {} of {count}, its name says 1 of {named}",
                no + 1
            )));
        }
        let mut files = vec![first];
        for i in 1..count {
            files.push(open_shard(&prefix, i, count)?);
        }
        let shards = Self { files };
        shards.check_tensors(path)?;
        Ok(shards)
    }

    /// Tensor names are unique across the shards and add up to the first
    /// shard's `split.tensors.count`.
    fn check_tensors(&self, path: &Path) -> Result<(), LlamaError> {
        let declared = split_int(&self.files[0], KEY_TENSORS);
        let mut names = HashSet::new();
        for f in &self.files {
            for t in f.tensors() {
                if !names.insert(t.name.as_str()) {
                    return Err(LlamaError::ShardMismatch {
                        path: f.path().to_path_buf(),
                        detail: format!("tensor {} is also in an earlier shard", t.name),
                    });
                }
            }
        }
        if declared != Some(names.len() as u32) {
            return Err(LlamaError::ShardMismatch {
                path: path.to_path_buf(),
                detail: format!(
                    "split.tensors.count is {declared:?} but the shards hold {} tensors",
                    names.len()
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn files(&self) -> &[GgufFile] {
        &self.files
    }

    /// The first file: metadata, vocabulary.
    pub(crate) fn first(&self) -> &GgufFile {
        &self.files[0]
    }

    /// A tensor and the shard that holds it.
    pub(crate) fn tensor(&self, name: &str) -> Option<(&GgufFile, &TensorInfo)> {
        self.files
            .iter()
            .find_map(|f| f.tensor(name).map(|t| (f, t)))
    }
}

/// A split key as a number (any integer type; absent: None).
fn split_int(g: &GgufFile, key: &str) -> Option<u32> {
    g.get_int(key).and_then(|v| u32::try_from(v).ok())
}

/// Shard `i` (0-based) of `count`, checked: present, complete, numbered `i` of `count`.
fn open_shard(prefix: &str, i: u32, count: u32) -> Result<GgufFile, LlamaError> {
    let path = PathBuf::from(shard_name(prefix, i + 1, count));
    let g = match GgufFile::open(&path) {
        Err(LlamaError::Missing { path }) => {
            return Err(LlamaError::ShardMissing {
                path,
                prefix: prefix.to_string(),
                no: i + 1,
                count,
            })
        }
        other => other?,
    };
    g.check_complete()?;
    let (no, n) = (split_int(&g, KEY_NO), split_int(&g, KEY_COUNT));
    if no != Some(i) || n != Some(count) {
        return Err(LlamaError::ShardMismatch {
            path,
            detail: format!(
                "its header says shard {} of {}, not {} of {count}: a shard of another split",
                no.map_or("?".into(), |n| (n + 1).to_string()),
                n.map_or("?".into(), |n| n.to_string()),
                i + 1
            ),
        });
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_drop_trailing_ones() {
        let t = |ne: [u64; 4]| TensorInfo {
            name: String::new(),
            ggml_type: crate::llama::quant::GgmlType::F32,
            ne,
            file_offset: 0,
            size_bytes: 0,
        };
        assert_eq!(t([64, 8, 1, 1]).dims(), &[64, 8]);
        assert_eq!(t([1, 1, 1, 1]).dims(), &[1]);
        assert_eq!(t([64, 1, 8, 1]).dims(), &[64, 1, 8]);
    }

    #[test]
    fn shard_names_round_trip() {
        let n = shard_name("/m/qwen3", 2, 3);
        assert_eq!(n, "/m/qwen3-00002-of-00003.gguf");
        assert_eq!(
            parse_shard_name(Path::new(&n)),
            Some(("/m/qwen3".into(), 2, 3))
        );
        assert_eq!(parse_shard_name(Path::new("/m/a-1-of-3.gguf")), None);
        assert_eq!(parse_shard_name(Path::new("/m/model.gguf")), None);
        assert_eq!(
            parse_shard_name(Path::new("a-b-00001-of-00012.gguf")),
            Some(("a-b".into(), 1, 12))
        );
    }
}
