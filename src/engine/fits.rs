//! The default mode of a MoE model when no streaming flag is given: resident
//! (llama.cpp's mmap, what `--resident` does) when the whole model file fits
//! the memory this run may use, streamed with `--cache-mb auto` otherwise.
//!
//! "Fits" is: file bytes + what the run needs beside the weights (the
//! context's KV cache and compute buffers as [`super::ctx_check`] estimates
//! them, the draft context's, and the RAM a serve's prompt cache holds) +
//! [`FIT_MARGIN_BYTES`] <= MemAvailable. MemAvailable counts the reclaimable
//! page cache, so a file already cached counts as room for itself: mapping
//! it reuses those pages. A resident run that does not fit would page its
//! experts through the kernel's readahead on every token, which the
//! streamed path exists to avoid; a streamed run that would fit starts its
//! expert cache cold each run while the page cache is warm (issue 66:
//! 7-8.5 against 2.5-4.3 tok/s on an 18.5 GB file on a 23 GiB host).

use crate::layout::MoeLayout;

use super::config::{RunConfig, MTP_UBATCH};
use super::mode::{Asked, Mode};
use super::prefill::TARGET_UBATCH;

/// Kept free beyond the file and the run's own buffers: the process (its
/// threads, the tokenizer, llama.cpp's own allocations that the estimate
/// leaves out) and the rest of the host. 1 GiB: about 5% of the 18.5 GB
/// file that motivated the rule, and twice the context check's headroom.
pub const FIT_MARGIN_BYTES: u64 = 1 << 30;

/// Testing only: stands in for MemAvailable in this decision (bytes), so a
/// test can make a small fixture "not fit".
pub const FAKE_MEM_AVAILABLE_ENV: &str = "BMOE_FAKE_MEM_AVAILABLE_BYTES";

const GIB: f64 = (1u64 << 30) as f64;

/// The terms of the decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fit {
    /// Bytes of the model's files.
    pub(crate) file_bytes: u64,
    /// KV cache, compute buffers and reserved RAM: what the run needs beside
    /// the weights.
    pub(crate) beside_bytes: u64,
    /// MemAvailable (or its test stand-in); None where it is not known.
    pub(crate) available_bytes: Option<u64>,
}

impl Fit {
    /// Whether the model runs resident: it fits, with the margin. Unknown
    /// memory streams (the safe side for a file of unknown size to the host).
    pub(crate) fn fits(&self) -> bool {
        self.available_bytes.is_some_and(|a| {
            self.file_bytes
                .saturating_add(self.beside_bytes)
                .saturating_add(FIT_MARGIN_BYTES)
                <= a
        })
    }

    /// The one line that says the decision.
    pub(crate) fn line(&self) -> String {
        let file = self.file_bytes as f64 / GIB;
        let terms = |a: u64| {
            format!(
                "{:.1} GiB available, less {:.1} GiB for the context and a {:.1} GiB margin",
                a as f64 / GIB,
                self.beside_bytes as f64 / GIB,
                FIT_MARGIN_BYTES as f64 / GIB
            )
        };
        match self.available_bytes {
            Some(a) if self.fits() => format!(
                "bmoe: the model ({file:.1} GiB) fits in memory ({}): running resident; \
                 --cache-mb auto streams it",
                terms(a)
            ),
            Some(a) => format!(
                "bmoe: the model ({file:.1} GiB) does not fit in memory ({}): streaming its \
                 experts with --cache-mb auto",
                terms(a)
            ),
            None => format!(
                "bmoe: MemAvailable is not known: streaming the model ({file:.1} GiB) with \
                 --cache-mb auto"
            ),
        }
    }
}

/// MemAvailable, or the test stand-in.
fn available_bytes() -> Option<u64> {
    match std::env::var(FAKE_MEM_AVAILABLE_ENV) {
        Ok(v) => v.trim().parse().ok(),
        Err(_) => crate::stream::memory::mem_available_bytes(),
    }
}

/// The terms for `cfg` on `layout` with `n_seq` sequences.
pub(crate) fn fit_of(cfg: &RunConfig, layout: &MoeLayout, n_seq: u32) -> Fit {
    let ubatch = match cfg.ubatch {
        super::prefill::Ubatch::Fixed(u) => u,
        super::prefill::Ubatch::Auto => TARGET_UBATCH,
    };
    let n_ctx = u64::from(cfg.n_ctx);
    let ubatch = u64::from(ubatch).min(n_ctx);
    let context = layout.ctx.as_ref().map_or(0, |shape| {
        let draft = cfg.speculation.source.head().map_or(0, |_| {
            shape.draft_bytes(n_ctx, u64::from(MTP_UBATCH).min(n_ctx))
        });
        shape.bytes(n_ctx, u64::from(n_seq), ubatch) + draft
    });
    let reserved = cfg.mode.stream().map_or(0, |s| s.reserved_bytes);
    Fit {
        file_bytes: layout.file_bytes,
        beside_bytes: context.saturating_add(reserved),
        available_bytes: available_bytes(),
    }
}

/// The mode to run: what `asked` says, and where it left the choice to bmoe
/// ([`Asked::Auto`]) on a model that streams, resident when it fits. Says
/// that decision on stderr, once.
pub(crate) fn choose(cfg: &RunConfig, layout: &MoeLayout, n_seq: u32, asked: Asked) -> Mode {
    match asked {
        Asked::Resident => Mode::Resident,
        Asked::Stream(s) | Asked::StreamMoe(s) => Mode::Stream(s),
        Asked::Auto(_) if !layout.is_moe() => Mode::Resident,
        Asked::Auto(s) => {
            let fit = fit_of(cfg, layout, n_seq);
            crate::say!("{}", fit.line());
            if fit.fits() {
                Mode::Resident
            } else {
                Mode::Stream(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(file_gib: f64, available_gib: Option<f64>) -> Fit {
        Fit {
            file_bytes: (file_gib * GIB) as u64,
            beside_bytes: (0.5 * GIB) as u64,
            available_bytes: available_gib.map(|a| (a * GIB) as u64),
        }
    }

    #[test]
    fn a_file_that_fits_with_the_margin_runs_resident() {
        // The host: 17.2 GiB of file, about 21 GiB available.
        let f = fit(17.2, Some(21.3));
        assert!(f.fits());
        let line = f.line();
        assert!(
            line.contains("fits in memory") && line.contains("running resident"),
            "{line}"
        );
        assert!(line.contains("--cache-mb auto streams it"), "{line}");
        // The 32.5 GB file does not.
        let big = fit(30.3, Some(21.3));
        assert!(!big.fits());
        assert!(big.line().contains("does not fit"), "{}", big.line());
    }

    #[test]
    fn the_margin_and_the_context_count() {
        // 1 GiB file + 0.5 GiB beside + 1 GiB margin = 2.5 GiB.
        assert!(fit(1.0, Some(2.5)).fits());
        assert!(!fit(1.0, Some(2.49)).fits());
        assert!(!fit(0.1, None).fits(), "unknown memory streams");
        assert!(fit(0.1, None).line().contains("not known"));
    }
}
