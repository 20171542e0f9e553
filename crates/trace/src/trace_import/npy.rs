//! Routed-experts arrays as `.npy`: a little-endian integer array of three
//! dimensions `[tokens][layers][k]` in C order (numpy's format: magic,
//! version, header length, a Python dict literal naming dtype, order and
//! shape, then the data).

use super::collect::{Collector, Route};
use super::types::{ImportError, Loc};

/// The file's first bytes.
pub(super) const MAGIC: &[u8] = b"\x93NUMPY";

/// An element type: bytes and signedness.
#[derive(Debug, Clone, Copy)]
struct Dtype {
    bytes: usize,
    signed: bool,
}

/// The header's fields.
struct Header {
    dtype: Dtype,
    shape: [usize; 3],
    /// Where the data starts.
    data: usize,
}

/// Read the whole array into `c`; returns what was read.
pub(super) fn parse(input: &[u8], c: &mut Collector) -> Result<String, ImportError> {
    let h = header(input)?;
    let [tokens, layers, k] = h.shape;
    let need = tokens
        .checked_mul(layers)
        .and_then(|n| n.checked_mul(k))
        .and_then(|n| n.checked_mul(h.dtype.bytes))
        .ok_or_else(|| ImportError::at(Loc::Byte(8), "the shape is too large"))?;
    let have = input.len() - h.data;
    if have < need {
        return Err(ImportError::at(
            Loc::Byte(input.len() as u64),
            format!(
                "the data ends here: shape {:?} needs {need} bytes after the header, the file has {have} (truncated?)",
                h.shape
            ),
        ));
    }
    let row = k * h.dtype.bytes;
    for t in 0..tokens {
        c.start_token();
        for l in 0..layers {
            let start = h.data + (t * layers + l) * row;
            let ids = input[start..start + row]
                .chunks_exact(h.dtype.bytes)
                .enumerate()
                .map(|(i, b)| id(b, h.dtype, (start + i * h.dtype.bytes) as u64))
                .collect::<Result<Vec<_>, _>>()?;
            let route = Route {
                layer: l as u32,
                ids,
                weights: None,
            };
            c.push(route, Loc::Byte(start as u64))?;
        }
    }
    Ok(format!(
        "npy {}{} array {:?}",
        if h.dtype.signed { "int" } else { "uint" },
        h.dtype.bytes * 8,
        h.shape
    ))
}

/// One element as an expert id.
fn id(b: &[u8], d: Dtype, at: u64) -> Result<u32, ImportError> {
    let mut raw = [0u8; 8];
    raw[..b.len()].copy_from_slice(b);
    if d.signed && b[b.len() - 1] & 0x80 != 0 {
        return Err(ImportError::at(Loc::Byte(at), "a negative expert id"));
    }
    u32::try_from(u64::from_le_bytes(raw))
        .map_err(|_| ImportError::at(Loc::Byte(at), "an expert id beyond 32 bits"))
}

/// The header: version, length, then the dict.
fn header(input: &[u8]) -> Result<Header, ImportError> {
    let cut = || ImportError::at(Loc::Byte(input.len() as u64), "the npy header is cut off");
    let major = *input.get(6).ok_or_else(cut)?;
    let (len, start) = match major {
        1 => {
            let b = input.get(8..10).ok_or_else(cut)?;
            (usize::from(u16::from_le_bytes([b[0], b[1]])), 10)
        }
        2 | 3 => {
            let b = input.get(8..12).ok_or_else(cut)?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        v => {
            return Err(ImportError::at(
                Loc::Byte(6),
                format!("npy version {v} is not one this reads (1 to 3)"),
            ))
        }
    };
    let dict = input.get(start..start + len).ok_or_else(cut)?;
    let dict = std::str::from_utf8(dict)
        .map_err(|_| ImportError::at(Loc::Byte(start as u64), "the npy header is not text"))?;
    let bad = |what: String| ImportError::at(Loc::Byte(start as u64), what);
    let descr = value(dict, "descr").ok_or_else(|| bad("the npy header has no descr".into()))?;
    let dtype = dtype(descr.trim_matches(['\'', '"'])).ok_or_else(|| {
        bad(format!(
            "dtype {descr}: expected little-endian integers (<i4, <i8, ...)"
        ))
    })?;
    if value(dict, "fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(bad("a Fortran-order array: save it in C order".into()));
    }
    let shape = value(dict, "shape")
        .and_then(shape)
        .ok_or_else(|| bad("expected a shape of three dimensions [tokens][layers][k]".into()))?;
    Ok(Header {
        dtype,
        shape,
        data: start + len,
    })
}

/// The text after `'key':` in the dict, up to the end of the dict.
fn value<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    let at = dict
        .find(&format!("'{key}'"))
        .or_else(|| dict.find(&format!("\"{key}\"")))?;
    let rest = &dict[at + key.len() + 2..];
    Some(rest.trim_start().strip_prefix(':')?.trim_start())
}

/// A dtype string: `<i4`, `<u2`, `|u1`, ...
fn dtype(s: &str) -> Option<Dtype> {
    let end: String = s.chars().take_while(|c| *c != '\'' && *c != '"').collect();
    let (order, rest) = end.split_at_checked(1)?;
    let (kind, size) = rest.split_at_checked(1)?;
    let bytes: usize = size.parse().ok()?;
    let one_byte = bytes == 1 && order == "|";
    if !(order == "<" || one_byte) || !matches!(bytes, 1 | 2 | 4 | 8) {
        return None;
    }
    match kind {
        "i" => Some(Dtype {
            bytes,
            signed: true,
        }),
        "u" => Some(Dtype {
            bytes,
            signed: false,
        }),
        _ => None,
    }
}

/// `(a, b, c)` as three sizes.
fn shape(s: &str) -> Option<[usize; 3]> {
    let inner = s.strip_prefix('(')?.split(')').next()?;
    let dims: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse().ok())
        .collect::<Option<_>>()?;
    dims.try_into().ok()
}
