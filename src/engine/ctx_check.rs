//! `-c`, `--parallel` and `--ubatch` checked before anything is allocated: the
//! context's KV cache and compute buffers, estimated from the gguf header,
//! against MemAvailable, and `-c` against the model's training context. A
//! context that does not fit is refused with the largest `-c` that does,
//! instead of llama.cpp growing into the host's memory until it is killed.

use crate::layout::CtxShape;
use crate::stream::compute_estimate_bytes;
use crate::stream::memory;

/// What is kept free for everything else (the model's dense weights are
/// mapped, the page cache, the process itself).
const HEADROOM_BYTES: u64 = 512 << 20;

/// Bytes per cached K or V element (llama.cpp's default f16 cache).
const KV_ELEMENT_BYTES: u64 = 2;

impl CtxShape {
    /// A draft (MTP) context of `n_ctx` positions computing `ubatch` tokens at
    /// a time: the nextn layers' KV and its own compute buffers.
    pub(crate) fn draft_bytes(&self, n_ctx: u64, ubatch: u64) -> u64 {
        let (nextn, n_layer) = self.nextn_share;
        let kv = self.kv_elements_per_token.saturating_mul(nextn) / n_layer;
        kv.saturating_mul(KV_ELEMENT_BYTES)
            .saturating_mul(n_ctx)
            .saturating_add(compute_estimate_bytes(
                ubatch,
                self.n_vocab,
                n_ctx,
                self.n_head,
            ))
    }

    /// The KV cache and compute buffers of `n_seq` sequences of `n_ctx`
    /// positions each, computed `ubatch` tokens at a time.
    pub(crate) fn bytes(&self, n_ctx: u64, n_seq: u64, ubatch: u64) -> u64 {
        let kv = self
            .kv_elements_per_token
            .saturating_mul(KV_ELEMENT_BYTES)
            .saturating_mul(n_ctx)
            .saturating_mul(n_seq);
        let total_ctx = n_ctx.saturating_mul(n_seq);
        kv.saturating_add(compute_estimate_bytes(
            ubatch,
            self.n_vocab,
            total_ctx,
            self.n_head,
        ))
    }

    /// The largest `-c` (a multiple of 256, as llama.cpp rounds) whose
    /// memory stays within `available_bytes` (0: not even 256).
    pub(crate) fn largest_fitting(&self, n_seq: u64, ubatch: u64, available_bytes: u64) -> u64 {
        let fits = |n: u64| self.bytes(n, n_seq, ubatch.min(n)) <= available_bytes;
        let (mut lo, mut hi) = (0u64, 1u64 << 24);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid * 256) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo * 256
    }
}

/// Why a context was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtxRefusal {
    #[error("-c {n_ctx} is over the model's training context ({n_ctx_train} tokens): give -c {n_ctx_train} or less")]
    OverTraining { n_ctx: u64, n_ctx_train: u64 },
    #[error("-c {n_ctx} x {n_seq} sequence(s) needs about {need_mib} MiB of KV cache and compute buffers, but {available_mib} MiB are available (MemAvailable less {HEADROOM_MIB} MiB headroom): give -c {fits} or less{parallel_hint}")]
    TooLarge {
        n_ctx: u64,
        n_seq: u64,
        need_mib: u64,
        available_mib: u64,
        fits: u64,
        parallel_hint: String,
    },
}

const HEADROOM_MIB: u64 = HEADROOM_BYTES >> 20;

/// What a run asks for: `-c`, sequences (`--parallel`), the micro-batch,
/// and the draft context's micro-batch when an MTP head drafts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CtxAsk {
    pub(crate) n_ctx: u64,
    pub(crate) n_seq: u64,
    pub(crate) ubatch: u64,
    pub(crate) draft_ubatch: Option<u64>,
}

/// Check the target context (and the draft context) against the training
/// context and `mem_available_bytes` (None: not known, no memory check).
pub(crate) fn check(
    shape: &CtxShape,
    ask: CtxAsk,
    mem_available_bytes: Option<u64>,
) -> Result<(), CtxRefusal> {
    let CtxAsk {
        n_ctx,
        n_seq,
        ubatch,
        draft_ubatch,
    } = ask;
    if let Some(n_ctx_train) = shape.n_ctx_train.filter(|&t| t > 0 && n_ctx > t) {
        return Err(CtxRefusal::OverTraining { n_ctx, n_ctx_train });
    }
    let Some(mem) = mem_available_bytes else {
        return Ok(());
    };
    let draft = draft_ubatch.map_or(0, |u| shape.draft_bytes(n_ctx, u.min(n_ctx)));
    let available = mem.saturating_sub(HEADROOM_BYTES);
    let need = shape.bytes(n_ctx, n_seq, ubatch.min(n_ctx)) + draft;
    if need <= available {
        return Ok(());
    }
    Err(CtxRefusal::TooLarge {
        n_ctx,
        n_seq,
        need_mib: need >> 20,
        available_mib: available >> 20,
        fits: shape.largest_fitting(n_seq, ubatch, available.saturating_sub(draft)),
        parallel_hint: if n_seq > 1 {
            " (or fewer --parallel)".into()
        } else {
            String::new()
        },
    })
}

/// [`check`] on the model's header facts and this host's MemAvailable (no
/// check where the header lacks them).
pub(crate) fn check_model(shape: Option<&CtxShape>, ask: CtxAsk) -> Result<(), CtxRefusal> {
    match shape {
        Some(shape) => check(shape, ask, memory::mem_available_bytes()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 30 layers of 3 KV heads of 64 (SmolLM2-135M's shape).
    fn smol() -> CtxShape {
        CtxShape {
            kv_elements_per_token: 30 * 3 * 128,
            n_vocab: 49152,
            n_head: 9,
            n_embd: 576,
            n_ctx_train: Some(8192),
            nextn_share: (1, 31),
        }
    }

    fn ask(n_ctx: u64, n_seq: u64) -> CtxAsk {
        CtxAsk {
            n_ctx,
            n_seq,
            ubatch: 512,
            draft_ubatch: None,
        }
    }

    #[test]
    fn a_context_over_the_training_length_is_refused() {
        let e = check(&smol(), ask(9000, 1), None).unwrap_err();
        assert!(e.to_string().contains("give -c 8192 or less"), "{e}");
        assert!(check(&smol(), ask(8192, 1), None).is_ok());
    }

    #[test]
    fn a_context_that_does_not_fit_names_the_largest_that_does() {
        let shape = CtxShape {
            n_ctx_train: None,
            ..smol()
        };
        let mem = 2u64 << 30;
        let e = check(&shape, ask(1_000_000_000, 1), Some(mem)).unwrap_err();
        let CtxRefusal::TooLarge { fits, .. } = e.clone() else {
            panic!("{e}")
        };
        assert!(fits > 0 && fits % 256 == 0);
        let available = mem - HEADROOM_BYTES;
        assert!(shape.bytes(fits, 1, 512) <= available);
        assert!(shape.bytes(fits + 256, 1, 512) > available);
        assert!(check(&shape, ask(fits, 1), Some(mem)).is_ok());
        let two = check(&shape, ask(fits, 2), Some(mem)).unwrap_err();
        assert!(two.to_string().contains("--parallel"), "{two}");
        let drafting = CtxAsk {
            draft_ubatch: Some(32),
            ..ask(fits, 1)
        };
        assert!(
            check(&shape, drafting, Some(mem)).is_err(),
            "the draft context's memory counts too"
        );
    }
}
