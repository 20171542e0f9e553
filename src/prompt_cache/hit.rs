//! What a lookup finds (a cached prefix and how much of the prompt it
//! covers) and the bytes the cache moved.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Bytes moved by the cache, for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
}

/// A cached prefix found for a prompt.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The tokens the state holds (the prompt shares `common` of them).
    pub tokens: Arc<[i32]>,
    pub state: Arc<Vec<u8>>,
    pub common: usize,
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
