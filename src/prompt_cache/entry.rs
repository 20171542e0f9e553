//! One cached state in a file: a magic, the [`Ident`] as JSON, the tokens, the
//! state bytes and a CRC-32 of everything before it.
//!
//! `MAGIC | ident_len u32 | ident JSON | n_tokens u32 | tokens i32... |
//! state_len u64 | state | crc32 u32`, little-endian.

use std::io::{BufWriter, Read, Write};
use std::path::Path;

use super::error::PromptCacheError;
use super::ident::Ident;
use super::owned::MAGIC;

/// The most tokens or ident bytes a head may claim (a damaged length is not
/// allowed to allocate without bound).
const MAX_HEAD_ITEMS: u32 = 1 << 24;

/// A cached state as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub ident: Ident,
    pub tokens: Vec<i32>,
    pub state: Vec<u8>,
}

/// The bytes before the state: magic, ident, tokens and the state's length.
pub(crate) fn head(ident: &Ident, tokens: &[i32], state_bytes: u64) -> Vec<u8> {
    let json = serde_json::to_vec(ident).unwrap_or_default();
    let mut b = Vec::with_capacity(32 + json.len() + tokens.len() * 4);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(json.len() as u32).to_le_bytes());
    b.extend_from_slice(&json);
    b.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    tokens
        .iter()
        .for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
    b.extend_from_slice(&state_bytes.to_le_bytes());
    b
}

/// Write an entry to `w` (the caller renames it into place).
pub(crate) fn write_to(
    w: &mut impl Write,
    ident: &Ident,
    tokens: &[i32],
    state: &[u8],
) -> std::io::Result<u64> {
    let h = head(ident, tokens, state.len() as u64);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h);
    crc.update(state);
    w.write_all(&h)?;
    w.write_all(state)?;
    w.write_all(&crc.finalize().to_le_bytes())?;
    Ok(h.len() as u64 + state.len() as u64 + 4)
}

/// Write an entry to `path` through a temporary file beside it renamed over
/// it, so a reader never sees half of one. Returns the bytes written.
pub fn write_entry(
    path: &Path,
    ident: &Ident,
    tokens: &[i32],
    state: &[u8],
) -> Result<u64, PromptCacheError> {
    super::owned::write_beside(path, |f| {
        let mut w = BufWriter::new(f);
        let n = write_to(&mut w, ident, tokens, state)?;
        w.flush()?;
        Ok(n)
    })
    .map_err(|e| PromptCacheError::io(path, e))
}

/// Read and check the entry at `path`: damaged (short, bad magic or CRC) or
/// written for another [`Ident`] than `want` is an error.
pub fn read_entry(path: &Path, want: &Ident) -> Result<Entry, PromptCacheError> {
    let e = read_any_entry(path)?;
    match want.differs(&e.ident) {
        Some(detail) => Err(PromptCacheError::Mismatch {
            path: path.to_path_buf(),
            detail,
        }),
        None => Ok(e),
    }
}

/// Whether `path` starts with the prompt cache's magic (a file that does
/// not is never written over: it is someone else's).
pub fn is_cache_file(path: &Path) -> bool {
    super::owned::has_magic(path)
}

/// Read the entry at `path`, checked against its CRC but of any ident.
pub fn read_any_entry(path: &Path) -> Result<Entry, PromptCacheError> {
    let bytes = crate::user_file::read_regular(path).map_err(|e| PromptCacheError::io(path, e))?;
    decode(&bytes).map_err(|detail| PromptCacheError::Corrupt {
        path: path.to_path_buf(),
        detail,
    })
}

/// An entry from its bytes, checked (the reason when it is damaged).
pub(crate) fn decode(bytes: &[u8]) -> Result<Entry, String> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err("shorter than a header".into());
    };
    let mut r = body;
    let (ident, tokens) = read_head(&mut r)?;
    let state_len = read_u64(&mut r)?;
    if state_len != r.len() as u64 {
        return Err(format!(
            "truncated: the state should be {state_len} bytes, {} are there",
            r.len()
        ));
    }
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err("the checksum does not match".into());
    }
    Ok(Entry {
        ident,
        tokens,
        state: r.to_vec(),
    })
}

/// The magic, the ident and the tokens from the start of an entry.
pub(crate) fn read_head(r: &mut impl Read) -> Result<(Ident, Vec<i32>), String> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .map_err(|_| "shorter than a header")?;
    if &magic != MAGIC {
        return Err("not a bmoe prompt cache file (bad magic)".into());
    }
    let json = read_items(r, 1)?;
    let ident = serde_json::from_slice(&json).map_err(|e| format!("bad ident: {e}"))?;
    let raw = read_items(r, 4)?;
    let tokens = raw
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((ident, tokens))
}

/// A u32 count, then that many items of `size` bytes.
fn read_items(r: &mut impl Read, size: usize) -> Result<Vec<u8>, String> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n).map_err(|_| "truncated header")?;
    let n = u32::from_le_bytes(n);
    if n > MAX_HEAD_ITEMS {
        return Err(format!("a header length of {n} is not plausible"));
    }
    let mut b = vec![0u8; n as usize * size];
    r.read_exact(&mut b).map_err(|_| "truncated header")?;
    Ok(b)
}

fn read_u64(r: &mut impl Read) -> Result<u64, String> {
    let mut n = [0u8; 8];
    r.read_exact(&mut n).map_err(|_| "truncated header")?;
    Ok(u64::from_le_bytes(n))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An ident for the store's tests (the disk store's too).
    pub(in crate::prompt_cache) fn ident() -> Ident {
        Ident {
            bmoe_version: "0.1.0".into(),
            model_bytes: 7,
            model_hash: "00".into(),
            n_ctx: 64,
            state_streams: 1,
            settings: String::new(),
        }
    }

    fn bytes() -> Vec<u8> {
        let mut b = Vec::new();
        write_to(&mut b, &ident(), &[1, 2, 3], &[9; 100]).unwrap();
        b
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let e = decode(&bytes()).unwrap();
        assert_eq!(
            (e.ident, e.tokens, e.state),
            (ident(), vec![1, 2, 3], vec![9; 100])
        );
    }

    #[test]
    fn a_truncated_or_flipped_entry_is_refused() {
        let b = bytes();
        for cut in [0, 5, 20, b.len() / 2, b.len() - 1] {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        for at in [0, 9, 40, b.len() - 50, b.len() - 1] {
            let mut f = b.clone();
            f[at] ^= 0x40;
            assert!(decode(&f).is_err(), "flipped at {at}");
        }
    }

    #[test]
    fn a_file_of_another_ident_is_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.bpc");
        write_entry(&p, &ident(), &[1], &[2; 8]).unwrap();
        assert!(read_entry(&p, &ident()).is_ok());
        let other_ctx = Ident {
            n_ctx: 128,
            ..ident()
        };
        assert!(
            read_entry(&p, &other_ctx).is_ok(),
            "another -c is no mismatch"
        );
        let other = Ident {
            state_streams: 2,
            ..ident()
        };
        let e = read_entry(&p, &other).unwrap_err().to_string();
        assert!(e.contains("another --parallel"), "{e}");
    }
}
