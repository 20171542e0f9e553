//! What happens to llama.cpp's mapping of the model once it is loaded:
//! expert ranges dropped, dense ranges left, warmed, locked or copied out.

use std::sync::Arc;

use super::Streamer;
use crate::stream::memory::{self, FileMapping};
use crate::stream::{
    budget::MIB, config::DenseMode, error::StreamError, hook::DenseAnon, hook::SharedAnon,
};

impl Streamer {
    /// After the model is loaded: drop the expert ranges of llama.cpp's mapping
    /// of each model file (the load populated them) and handle the dense
    /// weights per `dense`.
    pub(crate) fn prepare_mapping(
        &self,
        dense: DenseMode,
    ) -> Result<Option<SharedAnon>, StreamError> {
        let mut address_ranges = Vec::new();
        for (i, shard) in self.layout.shards.iter().enumerate() {
            let map = FileMapping::find(&shard.path, &self.premapped[i])?;
            for e in self.layout.experts.iter().filter(|e| e.shard == i) {
                map.drop_range(e.file_offset, e.bytes());
            }
            let dense_ranges = self.dense_ranges(i);
            match dense {
                DenseMode::Mmap => {}
                DenseMode::Anon => address_ranges.extend(map.address_ranges()),
                DenseMode::Warm => {
                    for (off, len) in &dense_ranges {
                        map.warm_range(*off, *len);
                    }
                }
                DenseMode::Mlock => lock_ranges(&map, &dense_ranges)?,
            }
        }
        Ok((dense == DenseMode::Anon)
            .then(|| Arc::new(std::sync::Mutex::new(DenseAnon::new(address_ranges)))))
    }

    /// Ranges of file `shard` that are not expert tensors (header and dense weights).
    fn dense_ranges(&self, shard: usize) -> Vec<(u64, u64)> {
        let mut ex: Vec<(u64, u64)> = self
            .layout
            .experts
            .iter()
            .filter(|e| e.shard == shard)
            .map(|e| (e.file_offset, e.file_offset + e.bytes()))
            .collect();
        ex.sort_unstable();
        let mut out = Vec::new();
        let mut pos = 0;
        for (a, b) in ex {
            if a > pos {
                out.push((pos, a - pos));
            }
            pos = pos.max(b);
        }
        let file_bytes = self.layout.shards[shard].file_bytes;
        if file_bytes > pos {
            out.push((pos, file_bytes - pos));
        }
        out
    }
}

/// Lock `ranges` of `map` in memory (`--dense-weights mlock`).
fn lock_ranges(map: &FileMapping, ranges: &[(u64, u64)]) -> Result<(), StreamError> {
    let need: u64 = ranges.iter().map(|r| r.1).sum();
    for &(off, len) in ranges {
        map.lock_range(off, len)
            .map_err(|source| StreamError::Mlock {
                need_mb: need.div_ceil(MIB),
                limit: memory::memlock_limit_bytes()
                    .map(|b| format!("{} KiB", b / 1024))
                    .unwrap_or_else(|| "unlimited".into()),
                source,
            })?;
    }
    Ok(())
}
