//! Streaming's settings as typed (`--cache-mb`, `--dense-weights`, ...) and
//! the cache budget a fixed size resolves to.

use std::path::PathBuf;

use bmoe_flash::cache::CachePolicy;
use bmoe_flash::FaultPlan;

use super::{budget::HEADROOM_BYTES, budget::MIB, cache_warm::WarmSource, error::StreamError};
use crate::layout::MoeLayout;

/// The largest `--cache-mb` / `--cache-ceil-mb` whose byte count fits a u64.
pub const MAX_CACHE_MB: u64 = u64::MAX / MIB;

/// `--cache-mb`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheSize {
    Mib(u64),
    /// A share of the model's expert bytes (`25%`), resolved at load.
    Percent(f64),
    /// What the host can spare once the model and its contexts exist
    /// ([`super::budget::AutoTerms`]), capped by `--cache-ceil-mb`.
    Auto,
}

impl CacheSize {
    /// The bytes a fixed size asks for out of `expert_bytes` (None for
    /// `auto`, which depends on the host once the model is loaded).
    pub fn asked_bytes(self, expert_bytes: u64) -> Option<u64> {
        match self {
            CacheSize::Mib(mb) => Some(mb.saturating_mul(MIB)),
            CacheSize::Percent(p) => Some((expert_bytes as f64 * p / 100.0) as u64),
            CacheSize::Auto => None,
        }
    }
}

/// As `--cache-mb` takes it (`--help` shows the default so).
impl std::fmt::Display for CacheSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheSize::Mib(mb) => write!(f, "{mb}"),
            CacheSize::Percent(p) => write!(f, "{p}%"),
            CacheSize::Auto => f.write_str("auto"),
        }
    }
}

impl std::str::FromStr for CacheSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(CacheSize::Auto);
        }
        if let Some(p) = s.strip_suffix('%') {
            return match p.parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=100.0).contains(&v) => Ok(CacheSize::Percent(v)),
                _ => Err(format!(
                    "expected a share of the expert bytes in 0%..=100%, got {s:?}"
                )),
            };
        }
        if let Ok(mb) = s.parse::<u64>() {
            if mb > MAX_CACHE_MB {
                return Err(format!(
                    "{mb} MiB does not fit in 64 bits of bytes (at most {MAX_CACHE_MB})"
                ));
            }
        }
        s.parse::<u64>().map(CacheSize::Mib).map_err(|_| {
            format!("expected a number of MiB, a share like 25% of the expert bytes, or 'auto', got {s:?}")
        })
    }
}

/// `--dense-weights`: what to do with the dense (non-expert) weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DenseMode {
    /// Leave them in llama.cpp's mapping (paged in on use).
    Mmap,
    /// Touch them once after load so they are resident from the first token.
    Warm,
    /// Copy them into anonymous memory (out of the page cache) on first use.
    Anon,
    /// Lock them in memory (needs RLIMIT_MEMLOCK above the dense bytes).
    Mlock,
}

impl DenseMode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DenseMode::Mmap => "mmap",
            DenseMode::Warm => "warm",
            DenseMode::Anon => "anon",
            DenseMode::Mlock => "mlock",
        }
    }
}

/// Streaming settings, as typed.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    pub cache: CacheSize,
    /// Upper bound of `--cache-mb auto` (None: what the host can spare).
    pub cache_ceil_mb: Option<u64>,
    pub io_threads: u32,
    pub o_direct: bool,
    pub dense: DenseMode,
    /// Wait for the down slices only at the activation (reads overlap gate/up compute).
    pub overlap: bool,
    /// Temporal prefetch depth (`--prefetch K`): layers read ahead from the last token's routing.
    pub prefetch: u32,
    /// Predictive prefetch (`--predict-prefetch`): score layer L+1's router at layer L.
    pub predict_prefetch: bool,
    /// `--drop-cold-experts F` (lossy; 0 is off).
    pub drop_cold: f32,
    /// Test-only `--inject-faults`: read through a fault-injecting reader (io_uring or pread).
    pub faults: Option<FaultPlan>,
    /// `--cache-policy`: the cache's eviction order.
    pub policy: CachePolicy,
    /// `--route-trace FILE`: record the verify decodes' routing there.
    pub route_trace: Option<PathBuf>,
    /// `--cache-warm`: start the cache from earlier runs' hottest experts.
    pub warm: WarmSource,
    /// Memory the process takes later (`bmoe serve`'s prompt cache in RAM):
    /// `--cache-mb auto` takes it out of what the host can spare first.
    pub reserved_bytes: u64,
    /// `--pretouch-mb`: pages backed ahead of the cache's growth, in bytes.
    pub pretouch_bytes: u64,
}

/// The one source of the streaming defaults: `bmoe run`'s flags show and use
/// these (`cli/stream.rs`), and so does everything else that streams.
impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            cache: CacheSize::Auto,
            cache_ceil_mb: None,
            io_threads: 4,
            o_direct: true,
            dense: DenseMode::Warm,
            overlap: false,
            prefetch: 0,
            predict_prefetch: false,
            drop_cold: 0.0,
            faults: None,
            policy: CachePolicy::default(),
            route_trace: None,
            warm: WarmSource::Off,
            reserved_bytes: 0,
            pretouch_bytes: PRETOUCH_DEFAULT_MIB << 20,
        }
    }
}

/// `--pretouch-mb`'s default: a token's fresh fills at auto on the Qwen3-30B
/// Q8_0 shape (60 MiB) fit in it (docs/benchmarks.md, "First touch").
pub const PRETOUCH_DEFAULT_MIB: u64 = 64;

/// The cache budget the engine starts with, in bytes (never more than all
/// experts): `auto` starts at 0 (the working set) until
/// [`super::streamer::Streamer::settle_auto`] decides it, once the contexts exist.
pub fn resolve_cache_bytes(
    cfg: &StreamConfig,
    layout: &MoeLayout,
    available: Option<u64>,
) -> Result<u64, StreamError> {
    let experts = layout.expert_bytes();
    let dense = layout.dense_bytes();
    let fits = available
        .map(|a| a.saturating_sub(dense + HEADROOM_BYTES))
        .unwrap_or(u64::MAX);
    let Some(asked) = cfg.cache.asked_bytes(experts) else {
        return Ok(0);
    };
    if asked.min(experts) > fits {
        return Err(StreamError::CacheTooLarge {
            asked_mb: asked / MIB,
            available_mb: available.unwrap_or(0) / MIB,
            dense_mb: dense / MIB,
            headroom_mb: HEADROOM_BYTES / MIB,
            fits_mb: fits / MIB,
        });
    }
    Ok(asked.min(experts))
}
