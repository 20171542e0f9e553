//! What names a model file in a cache entry: its size and a BLAKE3 hash of
//! every byte, so two files of one size whose tensors differ anywhere never
//! share states. Hashing a large file takes a while (a read of the whole
//! file), so the hash is computed once and remembered in a memo folder,
//! keyed by what changes when the file's bytes can have changed: its device,
//! inode, size, and change time (ctime, which no user-space call can set
//! back). A changed, replaced or copied file is hashed again.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes read per step of the hash.
const CHUNK_BYTES: usize = 4 << 20;
/// Files at least this large say on stderr that they are being hashed.
const SAY_ABOVE_BYTES: u64 = 1 << 30;
/// A memo file's first line.
const MEMO_MAGIC: &str = "bmoe-model-id 1";

/// The model file's size and the hex BLAKE3 of its bytes, from `memo` when
/// it holds this file's hash (a failed memo write is only a note).
pub fn model_id(path: &Path, memo: Option<&Path>) -> std::io::Result<(u64, String)> {
    let f = crate::user_file::open_regular(path)?;
    let md = f.metadata()?;
    let size = md.len();
    let memo_file = memo.map(|m| m.join(format!("{}.id", memo_key(&md))));
    if let Some(hash) = memo_file.as_deref().and_then(read_memo) {
        return Ok((size, hash));
    }
    let t0 = Instant::now();
    if size >= SAY_ABOVE_BYTES {
        crate::say!(
            "prompt cache: hashing {} ({:.1} GiB) once to name its states",
            path.display(),
            size as f64 / (1u64 << 30) as f64
        );
    }
    let hash = hash_file(f)?;
    tracing::info!(
        "prompt cache: {} hashed in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    if let Some(m) = &memo_file {
        if let Err(e) = write_memo(m, &hash) {
            tracing::info!(
                "prompt cache: the model's hash not remembered in {}: {e}",
                m.display()
            );
        }
    }
    Ok((size, hash))
}

/// The memo's name for a file: device, inode, size and ctime.
fn memo_key(md: &std::fs::Metadata) -> String {
    format!(
        "{:x}-{:x}-{:x}-{}.{:09}",
        md.dev(),
        md.ino(),
        md.len(),
        md.ctime(),
        md.ctime_nsec()
    )
}

/// BLAKE3 of every byte of `f`, in hex.
fn hash_file(mut f: std::fs::File) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().to_hex().to_string())
}

fn read_memo(file: &Path) -> Option<String> {
    let bytes = crate::user_file::read_regular(file).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    (lines.next()? == MEMO_MAGIC).then_some(())?;
    let hash = lines.next()?;
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| hash.to_string())
}

fn write_memo(file: &Path, hash: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp: PathBuf = file.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(format!("{MEMO_MAGIC}\n{hash}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_differing_past_any_prefix_get_other_ids_and_the_memo_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let memo = dir.path().join("memo");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let mut bytes = vec![7u8; 9 << 20];
        std::fs::write(&a, &bytes).unwrap();
        *bytes.last_mut().unwrap() = 8;
        std::fs::write(&b, &bytes).unwrap();
        let id_a = model_id(&a, Some(&memo)).unwrap();
        let id_b = model_id(&b, Some(&memo)).unwrap();
        assert_eq!(id_a.0, id_b.0);
        assert_ne!(id_a.1, id_b.1, "the last byte differs");
        assert_eq!(std::fs::read_dir(&memo).unwrap().count(), 2);
        // The memo answers (a wrong hash planted in it is what comes back).
        let key = memo_key(&std::fs::metadata(&a).unwrap());
        let planted = "0".repeat(64);
        write_memo(&memo.join(format!("{key}.id")), &planted).unwrap();
        assert_eq!(model_id(&a, Some(&memo)).unwrap().1, planted);
        // A rewrite changes ctime, so the memo no longer applies.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&a, &bytes).unwrap();
        assert_eq!(model_id(&a, Some(&memo)).unwrap().1, id_b.1);
        assert_eq!(model_id(&a, None).unwrap().1, id_b.1);
    }
}
