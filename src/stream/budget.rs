//! `--cache-mb auto`: the expert cache gets what the host can spare once
//! everything else exists. It is decided after the model is loaded and every
//! context (the target's, and with `--mtp` the draft's) is created, term by
//! term: MemAvailable at that point (the contexts' KV caches, cleared when
//! they are created, are already taken out of it), minus the dense weights
//! (they sit in the page cache, which MemAvailable counts as free), minus the
//! compute buffers llama.cpp touches only at the first decode (estimated),
//! minus a stated headroom, capped by `--cache-ceil-mb` and by the experts.

pub(super) const MIB: u64 = 1024 * 1024;

/// Memory left for everything else (the allocator, the reader's buffers,
/// the rest of the system).
pub(crate) const HEADROOM_BYTES: u64 = 512 * MIB;

/// One context's compute buffers, estimated from its shape: the logits of one
/// micro-batch (`n_ubatch x n_vocab` floats) and its attention scores
/// (`n_ubatch x n_ctx x n_head` floats; llama.cpp's CPU path keeps one layer's).
pub(crate) fn compute_estimate_bytes(n_ubatch: u64, n_vocab: u64, n_ctx: u64, n_head: u64) -> u64 {
    let floats = n_ubatch.saturating_mul(n_vocab.saturating_add(n_ctx.saturating_mul(n_head)));
    floats.saturating_mul(4)
}

/// The terms `--cache-mb auto` is resolved from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoTerms {
    /// MemAvailable after the load and the contexts.
    pub available: u64,
    pub dense: u64,
    /// Every context's compute buffers (see [`compute_estimate_bytes`]).
    pub compute: u64,
    pub headroom: u64,
    /// What the process takes later (the prompt cache's RAM budget).
    pub reserved: u64,
    /// `--cache-ceil-mb` (None: what the host can spare).
    pub ceiling: Option<u64>,
    /// All of the model's expert bytes (a bigger cache is never needed).
    pub experts: u64,
}

impl AutoTerms {
    /// What the host can spare.
    pub fn spare(&self) -> u64 {
        self.available
            .saturating_sub(self.dense)
            .saturating_sub(self.compute)
            .saturating_sub(self.headroom)
            .saturating_sub(self.reserved)
    }

    /// The budget: what the host can spare, capped by the ceiling and the experts.
    pub fn bytes(&self) -> u64 {
        self.spare()
            .min(self.ceiling.unwrap_or(u64::MAX))
            .min(self.experts)
    }

    /// How auto was resolved, for the summary.
    pub fn line(&self) -> String {
        let mb = |b: u64| b / MIB;
        let mut s = format!(
            "--cache-mb auto = MemAvailable {} MiB after the load and contexts - dense {} MiB \
             - compute buffers {} MiB (estimated) - headroom {} MiB = {} MiB",
            mb(self.available),
            mb(self.dense),
            mb(self.compute),
            mb(self.headroom),
            mb(self.spare())
        );
        if self.reserved > 0 {
            let at = s.rfind(" = ").unwrap_or(s.len());
            s.insert_str(at, &format!(" - prompt cache {} MiB", mb(self.reserved)));
        }
        if let Some(c) = self.ceiling.filter(|&c| c < self.spare()) {
            s += &format!(", capped by --cache-ceil-mb {}", mb(c));
        }
        if self.experts < self.spare().min(self.ceiling.unwrap_or(u64::MAX)) {
            s += &format!(", capped by all experts {} MiB", mb(self.experts));
        }
        s + &format!(": {} MiB", mb(self.bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms() -> AutoTerms {
        AutoTerms {
            available: 10_000 * MIB,
            dense: 1_000 * MIB,
            compute: 500 * MIB,
            headroom: HEADROOM_BYTES,
            reserved: 0,
            ceiling: None,
            experts: 60_000 * MIB,
        }
    }

    #[test]
    fn auto_is_what_the_host_spares_term_by_term() {
        let t = terms();
        assert_eq!(t.bytes(), 7_988 * MIB);
        assert_eq!(
            t.line(),
            "--cache-mb auto = MemAvailable 10000 MiB after the load and contexts - dense 1000 MiB \
             - compute buffers 500 MiB (estimated) - headroom 512 MiB = 7988 MiB: 7988 MiB"
        );
        let capped = AutoTerms {
            ceiling: Some(4096 * MIB),
            ..t
        };
        assert_eq!(capped.bytes(), 4096 * MIB);
        assert!(capped
            .line()
            .ends_with("capped by --cache-ceil-mb 4096: 4096 MiB"));
        let served = AutoTerms {
            reserved: 512 * MIB,
            ..t
        };
        assert_eq!(served.bytes(), 7_476 * MIB);
        assert!(served
            .line()
            .contains("headroom 512 MiB - prompt cache 512 MiB = 7476 MiB"));
        let small = AutoTerms {
            experts: 300 * MIB,
            ..t
        };
        assert!(small
            .line()
            .ends_with("capped by all experts 300 MiB: 300 MiB"));
        let short = AutoTerms {
            available: 1_000 * MIB,
            ..t
        };
        assert_eq!(short.bytes(), 0, "never negative");
    }

    #[test]
    fn the_compute_estimate_counts_logits_and_scores() {
        assert_eq!(compute_estimate_bytes(512, 1000, 100, 4), 512 * 1400 * 4);
        assert_eq!(compute_estimate_bytes(u64::MAX, 2, 2, 2), u64::MAX);
    }
}
