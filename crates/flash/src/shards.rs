//! A model split over several files, read as one address space: file i's
//! byte b is at `base_i + b`, the bases increasing and far enough apart that
//! no slice crosses from one file into the next. One reader per file; the
//! flash actor and its cache see only the combined offsets.

use std::path::PathBuf;

use super::{
    error::FlashError, io::ReadOp, io::ReadStats, io::SliceReader, open::open_reader,
    open::ReaderNote,
};

/// One file of the model and where it starts in the address space.
#[derive(Debug, Clone)]
pub struct ShardFile {
    pub path: PathBuf,
    pub base: u64,
}

/// Reads each op from the file whose range holds it.
pub struct ShardedReader {
    /// (base, reader), by increasing base.
    parts: Vec<(u64, Box<dyn SliceReader>)>,
    local: Vec<ReadOp>,
}

impl ShardedReader {
    /// `parts` as (base, reader); the bases must increase.
    pub fn new(parts: Vec<(u64, Box<dyn SliceReader>)>) -> Result<Self, FlashError> {
        if parts.is_empty() || parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(FlashError::ShardOrder);
        }
        Ok(Self {
            parts,
            local: Vec::new(),
        })
    }

    /// The part holding combined offset `off`.
    fn part_of(&self, off: u64) -> usize {
        self.parts.partition_point(|p| p.0 <= off).saturating_sub(1)
    }
}

impl SliceReader for ShardedReader {
    // Each op goes unchanged, with a local offset, to the reader of its file.
    // SAFETY: callers uphold the trait's contract (see `SliceReader::read_all`).
    unsafe fn read_all(&mut self, ops: &[ReadOp]) -> Result<ReadStats, FlashError> {
        let mut total = ReadStats::default();
        for i in 0..self.parts.len() {
            let base = self.parts[i].0;
            let mut local = std::mem::take(&mut self.local);
            local.clear();
            local.extend(
                ops.iter()
                    .filter(|op| self.part_of(op.file_offset) == i)
                    .map(|op| ReadOp {
                        file_offset: op.file_offset - base,
                        ..*op
                    }),
            );
            let result = if local.is_empty() {
                Ok(ReadStats::default())
            } else {
                // Only the file offsets are made local.
                // SAFETY: the caller's destinations, under the caller's contract.
                unsafe { self.parts[i].1.read_all(&local) }
            };
            self.local = local;
            let s = result?;
            total.device_bytes += s.device_bytes;
            total.ops += s.ops;
            total.retries += s.retries;
            total.elapsed += s.elapsed;
        }
        Ok(total)
    }

    fn in_flight(&self) -> usize {
        self.parts.iter().map(|p| p.1.in_flight()).sum()
    }

    fn direct(&self) -> bool {
        self.parts.iter().all(|p| p.1.direct())
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} files, one reader each)",
            self.parts[0].1.describe(),
            self.parts.len()
        )
    }
}

/// One reader over `files` (a plain reader when there is one file at base 0).
pub fn open_files(
    files: &[ShardFile],
    want_direct: bool,
    queue_depth: u32,
    max_slice_bytes: u64,
) -> Result<(Box<dyn SliceReader>, Vec<ReaderNote>), FlashError> {
    if let [only] = files {
        if only.base == 0 {
            return open_reader(&only.path, want_direct, queue_depth, max_slice_bytes);
        }
    }
    let mut parts = Vec::with_capacity(files.len());
    let mut notes = Vec::new();
    for f in files {
        let (reader, n) = open_reader(&f.path, want_direct, queue_depth, max_slice_bytes)?;
        parts.push((f.base, reader));
        notes.extend(n);
    }
    Ok((Box::new(ShardedReader::new(parts)?), notes))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_of(byte: u8, len: usize) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![byte; len]).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn each_op_is_read_from_the_file_that_holds_it() {
        let (a, b) = (file_of(1, 10_000), file_of(2, 10_000));
        let files = [
            ShardFile {
                path: a.path().into(),
                base: 0,
            },
            ShardFile {
                path: b.path().into(),
                base: 12_288,
            },
        ];
        let (mut r, _) = open_files(&files, false, 2, 8192).unwrap();
        let mut bufs = [vec![0u8; 100], vec![0u8; 5000], vec![0u8; 7]];
        let offs = [9_900u64, 12_288 + 4_000, 50];
        let ops: Vec<ReadOp> = bufs
            .iter_mut()
            .zip(offs)
            .map(|(buf, off)| ReadOp {
                dst: buf.as_mut_ptr(),
                file_offset: off,
                len: buf.len() as u64,
            })
            .collect();
        // SAFETY: every destination is a live buffer of its length.
        let stats = unsafe { r.read_all(&ops) }.unwrap();
        assert_eq!(stats.ops, 3);
        assert!(bufs[0].iter().all(|&x| x == 1));
        assert!(bufs[1].iter().all(|&x| x == 2));
        assert!(bufs[2].iter().all(|&x| x == 1));
        assert!(r.describe().contains("2 files"), "{}", r.describe());
    }

    #[test]
    fn bases_must_increase() {
        let (a, _) = open_reader(file_of(1, 10).path(), false, 1, 16).unwrap();
        let (b, _) = open_reader(file_of(1, 10).path(), false, 1, 16).unwrap();
        assert!(ShardedReader::new(vec![(4096, a), (0, b)]).is_err());
    }
}
