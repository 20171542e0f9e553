//! Warm start's memory across runs: how often each (layer, expert) slot was
//! routed by single-token decodes, decayed per run ([`WarmProfile`]), its
//! file format, and which slots a new run reads before its first demand
//! ([`WarmProfile::plan`]). Pure: bytes in, bytes out; the engine finds the
//! file and the flash actor reads the slots.
//!
//! File (little-endian): magic `BMWS`, version u16, reserved u16, n_layer u32,
//! n_expert u32, k u32, identity u64, tokens f64, runs u32, then n_layer u64
//! slot sizes in bytes, n_layer × n_expert f32 decayed counts (layer-major),
//! and an FNV-1a 64 checksum of everything before it.

use crate::cache::SlotKey;

const MAGIC: &[u8; 4] = b"BMWS";
const VERSION: u16 = 1;
/// What the counts of earlier runs keep at each merge: a half-life of about
/// three runs, so the profile follows a change of workload instead of freezing.
pub const DECAY_PER_RUN: f64 = 0.8;
/// A profile is used only once it has seen this many decoded tokens.
pub const MATURE_TOKENS: f64 = 32.0;
/// The share of the cache budget warm start may fill at most.
pub const WARM_SHARE: f64 = 0.5;
/// A layer whose k hottest experts carry less than this multiple of k/n_expert
/// of its routings routes near-uniformly: warming it buys nothing.
pub const SKEW_MIN: f64 = 1.5;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WarmError {
    #[error("not a bmoe warm-start profile (bad magic)")]
    BadMagic,
    #[error("profile version {0} is not {VERSION} (written by another bmoe)")]
    Version(u16),
    #[error("profile is cut short ({0} bytes)")]
    Truncated(usize),
    #[error("profile checksum does not match (the file is damaged)")]
    Checksum,
    #[error("profile is for another model: {0}")]
    Mismatch(String),
}

/// 64-bit FNV-1a over `bytes`, continuing from `seed` (start with [`FNV_SEED`]).
/// (The `fnv` crate's hasher, as the rpc-server's cache check uses.)
pub fn fnv1a64(seed: u64, bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::with_key(seed);
    h.write(bytes);
    h.finish()
}

pub const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// What a profile must match to be used: the model's shape and identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    pub n_expert: u32,
    /// Experts routed per token.
    pub k: u32,
    /// Bytes of one slot of each layer (0 for a layer without experts).
    pub slot_bytes: Vec<u64>,
    /// A hash of the model's files (their headers, sizes and expert map).
    pub identity: u64,
}

impl ModelShape {
    fn n_layer(&self) -> usize {
        self.slot_bytes.len()
    }

    fn moe_layers(&self) -> usize {
        self.slot_bytes.iter().filter(|&&b| b > 0).count()
    }

    /// Why `other` is not this model (None when it is).
    fn differs(&self, other: &ModelShape) -> Option<String> {
        if self.identity != other.identity {
            return Some(format!(
                "identity {:016x}, the model's is {:016x}",
                other.identity, self.identity
            ));
        }
        if self != other {
            return Some(format!(
                "{} layers x {} experts (k {}), the model has {} x {} (k {})",
                other.n_layer(),
                other.n_expert,
                other.k,
                self.n_layer(),
                self.n_expert,
                self.k
            ));
        }
        None
    }
}

/// Decayed per-slot routing counts of single-token decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmProfile {
    pub shape: ModelShape,
    /// Decoded tokens the counts stand for (decayed like them).
    pub tokens: f64,
    /// Runs merged in.
    pub runs: u32,
    /// Layer-major: counts[layer * n_expert + expert].
    pub counts: Vec<f32>,
}

impl WarmProfile {
    pub fn empty(shape: ModelShape) -> Self {
        let n = shape.n_layer() * shape.n_expert as usize;
        Self {
            shape,
            tokens: 0.0,
            runs: 0,
            counts: vec![0.0; n],
        }
    }

    /// Fold one run's counts (same layout as `counts`) in: earlier runs keep
    /// [`DECAY_PER_RUN`] of their weight. The run's tokens are its routings
    /// over k per MoE layer.
    pub fn merge_run(&mut self, run_counts: &[u32]) {
        debug_assert_eq!(run_counts.len(), self.counts.len());
        let d = DECAY_PER_RUN as f32;
        for (c, &r) in self.counts.iter_mut().zip(run_counts) {
            *c = *c * d + r as f32;
        }
        self.tokens = self.tokens * DECAY_PER_RUN + run_tokens(&self.shape, run_counts);
        self.runs += 1;
    }

    pub fn is_mature(&self) -> bool {
        self.tokens >= MATURE_TOKENS
    }

    /// The slots to read before the first demand, hottest first, within
    /// [`WARM_SHARE`] of `budget_bytes`: slots routed by more than the uniform
    /// share (k/n_expert per token) in layers that are not near-uniform.
    pub fn plan(&self, budget_bytes: u64) -> Vec<SlotKey> {
        let n = self.shape.n_expert as usize;
        if n == 0 || self.tokens <= 0.0 {
            return Vec::new();
        }
        let uniform = f64::from(self.shape.k) / n as f64;
        let mut hot: Vec<(f64, SlotKey)> = Vec::new();
        for (layer, row) in self.counts.chunks(n).enumerate() {
            if self.shape.slot_bytes[layer] == 0 || !skewed(row, self.shape.k as usize) {
                continue;
            }
            for (expert, &c) in row.iter().enumerate() {
                let rate = f64::from(c) / self.tokens;
                if rate > uniform {
                    let key = SlotKey {
                        layer: layer as u32,
                        expert: expert as u32,
                    };
                    hot.push((rate, key));
                }
            }
        }
        hot.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let cap = (budget_bytes as f64 * WARM_SHARE) as u64;
        let mut used = 0u64;
        let mut out = Vec::new();
        for (_, key) in hot {
            let b = self.shape.slot_bytes[key.layer as usize];
            if used + b > cap {
                break;
            }
            used += b;
            out.push(key);
        }
        out
    }

    /// Every slot's routings per decoded token (at most 1), where it has any.
    pub fn rates(&self) -> Vec<(SlotKey, f32)> {
        let n = self.shape.n_expert as usize;
        if n == 0 || self.tokens <= 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (layer, row) in self.counts.chunks(n).enumerate() {
            for (expert, &c) in row.iter().enumerate().filter(|(_, &c)| c > 0.0) {
                let key = SlotKey {
                    layer: layer as u32,
                    expert: expert as u32,
                };
                out.push((key, (f64::from(c) / self.tokens).min(1.0) as f32));
            }
        }
        out
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let s = &self.shape;
        let mut v = Vec::with_capacity(48 + 8 * s.n_layer() + 4 * self.counts.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&(s.n_layer() as u32).to_le_bytes());
        v.extend_from_slice(&s.n_expert.to_le_bytes());
        v.extend_from_slice(&s.k.to_le_bytes());
        v.extend_from_slice(&s.identity.to_le_bytes());
        v.extend_from_slice(&self.tokens.to_le_bytes());
        v.extend_from_slice(&self.runs.to_le_bytes());
        for b in &s.slot_bytes {
            v.extend_from_slice(&b.to_le_bytes());
        }
        for c in &self.counts {
            v.extend_from_slice(&c.to_le_bytes());
        }
        let sum = fnv1a64(FNV_SEED, &v);
        v.extend_from_slice(&sum.to_le_bytes());
        v
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, WarmError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(WarmError::BadMagic);
        }
        let version = u16::from_le_bytes(r.array()?);
        if version != VERSION {
            return Err(WarmError::Version(version));
        }
        r.take(2)?;
        let n_layer = u32::from_le_bytes(r.array()?) as usize;
        let n_expert = u32::from_le_bytes(r.array()?);
        let k = u32::from_le_bytes(r.array()?);
        let identity = u64::from_le_bytes(r.array()?);
        let tokens = f64::from_le_bytes(r.array()?);
        let runs = u32::from_le_bytes(r.array()?);
        let n_counts = n_layer.saturating_mul(n_expert as usize);
        // Size check before allocating what a damaged header claims.
        let need = r.at + 8 * n_layer + 4 * n_counts + 8;
        if bytes.len() < need {
            return Err(WarmError::Truncated(bytes.len()));
        }
        let slot_bytes = (0..n_layer)
            .map(|_| r.array().map(u64::from_le_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let counts = (0..n_counts)
            .map(|_| r.array().map(f32::from_le_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let body = r.at;
        let sum = u64::from_le_bytes(r.array()?);
        if sum != fnv1a64(FNV_SEED, &bytes[..body]) || !tokens.is_finite() {
            return Err(WarmError::Checksum);
        }
        let shape = ModelShape {
            n_expert,
            k,
            slot_bytes,
            identity,
        };
        Ok(Self {
            shape,
            tokens,
            runs,
            counts,
        })
    }

    /// Parse `bytes` and check it is a profile of `model`.
    pub fn for_model(bytes: &[u8], model: &ModelShape) -> Result<Self, WarmError> {
        let p = Self::from_bytes(bytes)?;
        match model.differs(&p.shape) {
            Some(why) => Err(WarmError::Mismatch(why)),
            None => Ok(p),
        }
    }
}

/// Decoded tokens behind one run's counts: its routings over k per MoE layer.
pub fn run_tokens(shape: &ModelShape, run_counts: &[u32]) -> f64 {
    let per_token = u64::from(shape.k) * shape.moe_layers() as u64;
    if per_token == 0 {
        return 0.0;
    }
    run_counts.iter().map(|&c| u64::from(c)).sum::<u64>() as f64 / per_token as f64
}

/// Whether a layer's k hottest experts carry at least [`SKEW_MIN`] times
/// their uniform share of its routings.
fn skewed(row: &[f32], k: usize) -> bool {
    let total: f64 = row.iter().map(|&c| f64::from(c)).sum();
    if total <= 0.0 || row.is_empty() {
        return false;
    }
    let mut sorted: Vec<f32> = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top: f64 = sorted.iter().take(k).map(|&c| f64::from(c)).sum();
    top / total >= SKEW_MIN * k as f64 / row.len() as f64
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WarmError> {
        let s = self
            .bytes
            .get(self.at..self.at + n)
            .ok_or(WarmError::Truncated(self.bytes.len()))?;
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WarmError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
}

#[cfg(test)]
mod tests;
