//! What can go wrong while setting up or running expert streaming.

use std::path::PathBuf;

use bmoe_flash::FlashError;

/// Streaming's errors: the flash actor's, the model's layout, the cache
/// budget, and the streaming flags' own.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Flash(#[from] FlashError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--predict-prefetch cannot use this model's routers: {0}")]
    Predict(String),
    #[error(
        "--predict-prefetch cannot guess this model's next-layer routing: {0}; drop \
         --predict-prefetch for this model"
    )]
    PredictUnsupported(String),
    #[error("--route-trace {path}: {reason}", path = path.display())]
    RouteTrace { path: PathBuf, reason: String },
    #[error("--cache-warm {0}")]
    Warm(String),
    #[error("--inject-faults reads one file; this model is split into shards")]
    FaultsOnSplit,
    #[error("cannot find llama.cpp's mapping of {0} in /proc/self/maps")]
    NoMapping(String),
    #[error(
        "{model} has no ffn_{{gate,up,down}}_exps tensors (n_expert {n_expert}): it is a dense model \
         or an MoE layout bmoe does not know; drop --moe-stream (it runs resident)"
    )]
    NotMoe { model: String, n_expert: u32 },
    #[error(
        "{model} declares {n_expert} experts but has no blk.N.ffn_{{gate,up,gate_up,down}}_exps \
         tensors (expert tensors seen: {seen}): an MoE layout bmoe cannot stream (run it with \
         --resident)"
    )]
    UnknownLayout {
        model: String,
        n_expert: u32,
        seen: String,
    },
    #[error(
        "--cache-mb {asked_mb} does not fit: MemAvailable is {available_mb} MiB; with the dense \
         weights ({dense_mb} MiB) and {headroom_mb} MiB of headroom at most {fits_mb} MiB fits \
         (or use --cache-mb auto)"
    )]
    CacheTooLarge {
        asked_mb: u64,
        available_mb: u64,
        dense_mb: u64,
        headroom_mb: u64,
        fits_mb: u64,
    },
    #[error(
        "--dense-weights mlock: locking {need_mb} MiB failed ({source}); RLIMIT_MEMLOCK is {limit}; \
         raise it (ulimit -l) or use --dense-weights warm"
    )]
    Mlock {
        need_mb: u64,
        limit: String,
        #[source]
        source: std::io::Error,
    },
}
