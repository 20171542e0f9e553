//! A bounded walk over a gguf header before ggml's reader sees it. ggml's
//! reader rejects most malformed headers cleanly, but a few inputs reach a
//! `GGML_ASSERT` (an abort bmoe cannot catch): a tensor shape whose element
//! count overflows 64 bits (found by fuzzing, `benches/fuzz.sh`). This walk
//! refuses those with a clear message, and bounds every count and length by the
//! bytes left in the file, so nothing here allocates more than the file holds.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// ggml's limits (GGML_MAX_DIMS, GGML_MAX_NAME, GGML_TYPE_COUNT in this
/// llama.cpp; the bindings do not export the macros).
const MAX_DIMS: u64 = 4;
const MAX_NAME: u64 = 64;

/// gguf value types.
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const N_TYPES: u32 = 13;

/// Bytes of a scalar of gguf type `ty` (None for string/array/unknown).
fn scalar_bytes(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// The header as a byte stream that never reads past the file's end.
struct Cursor {
    r: BufReader<File>,
    left: u64,
}

type Check<T> = Result<T, String>;

impl Cursor {
    fn bytes<const N: usize>(&mut self, what: &str) -> Check<[u8; N]> {
        if self.left < N as u64 {
            return Err(format!("the file ends inside {what}"));
        }
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("reading {what}: {e}"))?;
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Check<u32> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Check<u64> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64, what: &str) -> Check<()> {
        if n > self.left {
            return Err(format!("{what} ({n} bytes) runs past the end of the file"));
        }
        let copied = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())
            .map_err(|e| format!("reading {what}: {e}"))?;
        if copied != n {
            return Err(format!("the file ends inside {what}"));
        }
        self.left -= n;
        Ok(())
    }

    /// A string: its length is checked against the file before anything is read.
    fn string(&mut self, what: &str, keep_up_to: u64) -> Check<String> {
        let n = self.u64(what)?;
        if n > self.left {
            return Err(format!("{what} claims {n} bytes, past the end of the file"));
        }
        if n > keep_up_to {
            self.skip(n, what)?;
            return Ok(String::new());
        }
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("reading {what}: {e}"))?;
        self.left -= n;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// `count` entries of at least `min_bytes` each must fit in what is left.
    fn fits(&self, count: u64, min_bytes: u64, what: &str) -> Check<()> {
        if count.saturating_mul(min_bytes) > self.left {
            return Err(format!(
                "{what} count {count} cannot fit in the {} bytes left",
                self.left
            ));
        }
        Ok(())
    }

    fn value(&mut self, ty: u32, key: &str) -> Check<()> {
        if let Some(n) = scalar_bytes(ty) {
            return self.skip(n, key);
        }
        match ty {
            TYPE_STRING => self.string(key, 0).map(|_| ()),
            TYPE_ARRAY => {
                let ety = self.u32(key)?;
                let n = self.u64(key)?;
                if ety == TYPE_ARRAY || ety >= N_TYPES {
                    return Err(format!("{key}: array of type {ety}"));
                }
                let min = scalar_bytes(ety).unwrap_or(8);
                self.fits(n, min, key)?;
                match scalar_bytes(ety) {
                    Some(b) => self.skip(n * b, key),
                    None => (0..n).try_for_each(|_| self.string(key, 0).map(|_| ())),
                }
            }
            _ => Err(format!("{key}: unknown value type {ty}")),
        }
    }

    fn tensor(&mut self, i: u64) -> Check<()> {
        let what = format!("tensor {i}'s name");
        let name = self.string(&what, MAX_NAME)?;
        let n_dims = u64::from(self.u32("a tensor's dimension count")?);
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(format!(
                "tensor {i} ({name}) has {n_dims} dimensions (1..=4)"
            ));
        }
        let mut ne = [1i64; MAX_DIMS as usize];
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = self.u64("a tensor dimension")? as i64;
        }
        check_elements(&ne).map_err(|e| format!("tensor {i} ({name}) shape {ne:?}: {e}"))?;
        self.u32("a tensor type")?;
        self.u64("a tensor offset")?;
        Ok(())
    }
}

/// The element count of a shape fits in 64 bits, as ggml asserts when it
/// creates the tensor (the same test, so nothing it would abort on passes).
fn check_elements(ne: &[i64]) -> Result<(), String> {
    if ne.iter().any(|&d| d < 0) {
        return Err("a negative dimension".into());
    }
    let mut n = ne[0];
    for &d in &ne[1..] {
        if d > 1 {
            if i64::MAX / d <= n {
                return Err("more elements than fit in 64 bits".into());
            }
            n *= d;
        }
    }
    Ok(())
}

/// Walk the header of `path` (`file_bytes` long, magic already checked).
/// Returns what is wrong, for a "corrupt gguf header" error.
pub(crate) fn check(path: &Path, file_bytes: u64) -> Result<(), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let mut c = Cursor {
        r: BufReader::with_capacity(1 << 16, f),
        left: file_bytes,
    };
    c.bytes::<4>("the magic")?;
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("gguf version {version} (bmoe reads 2 and 3)"));
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    // A key/value is at least a key length, a type and a byte; a tensor entry
    // at least a name length, a dimension count, one dimension, type, offset.
    c.fits(n_kv, 8 + 4 + 1, "metadata")?;
    c.fits(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor")?;
    for _ in 0..n_kv {
        let key = c.string("a metadata key", 256)?;
        let ty = c.u32(&key)?;
        c.value(ty, &key)?;
    }
    (0..n_tensors).try_for_each(|i| c.tensor(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts_that_overflow_are_refused() {
        assert!(check_elements(&[32, 16, 4, 1]).is_ok());
        assert!(check_elements(&[i64::MAX, 1, 1, 1]).is_ok());
        assert!(check_elements(&[2, i64::MAX / 2, 1, 1]).is_err());
        assert!(check_elements(&[1 << 32, 1 << 31, 1, 1]).is_err());
        assert!(check_elements(&[-1, 1, 1, 1]).is_err());
    }
}
