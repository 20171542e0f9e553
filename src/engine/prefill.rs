//! The prompt's pass (prefill): the micro-batch it runs in, and what it cost
//! (time, and streamed: bytes read against the distinct routed slices) for the
//! summary's `prefill:` line, the CSV trailer and `BMOE_DONE`.
//!
//! Why the micro-batch matters when streaming: every micro-batch of a long
//! prompt routes to nearly every expert of every layer, and between two
//! micro-batches all the other layers run, so with a cache smaller than the
//! experts each micro-batch reads the layer again. One micro-batch over the
//! whole prompt reads each routed slice once.

use std::time::Duration;

use bmoe_decode::telemetry::Row as TokenRow;

/// The smallest `--ubatch` (a verify batch of the widest draft must fit one).
pub(crate) const UBATCH_MIN: u32 = 16;
/// The target context's logical and physical batch.
pub const TARGET_UBATCH: u32 = 512;
/// The largest micro-batch auto picks (its compute buffers grow with it).
pub const UBATCH_MAX: u32 = 8192;
/// Auto rounds the micro-batch up to a multiple of this.
const UBATCH_STEP: u64 = 64;

const MIB: f64 = 1024.0 * 1024.0;

/// `--ubatch N|auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ubatch {
    /// The prompt in the fewest micro-batches whose compute buffers fit.
    #[default]
    Auto,
    Fixed(u32),
}

impl std::str::FromStr for Ubatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Ubatch::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (UBATCH_MIN..=UBATCH_MAX).contains(&n) => Ok(Ubatch::Fixed(n)),
            _ => Err(format!(
                "expected auto or a token count in {UBATCH_MIN}..={UBATCH_MAX}"
            )),
        }
    }
}

/// The micro-batch for a prompt of `prompt_tokens` in a context of `n_ctx`:
/// a fixed one capped by the context; auto: the fewest micro-batches of equal
/// size (a multiple of 64, at least [`TARGET_UBATCH`], at most the context and
/// [`UBATCH_MAX`]) whose compute buffers `fits`.
pub fn choose_ubatch(
    choice: Ubatch,
    prompt_tokens: usize,
    n_ctx: u32,
    fits: impl Fn(u32) -> bool,
) -> u32 {
    let cap = n_ctx.clamp(1, UBATCH_MAX);
    let floor = TARGET_UBATCH.min(cap);
    let Ubatch::Fixed(n) = choice else {
        let p = (prompt_tokens as u64).max(1);
        let mut chunks = p.div_ceil(u64::from(cap));
        loop {
            let per = p.div_ceil(chunks).next_multiple_of(UBATCH_STEP);
            let u = per.min(u64::from(cap)).max(u64::from(floor)) as u32;
            if u == floor || fits(u) {
                debug_assert!((floor..=cap).contains(&u));
                return u;
            }
            chunks += 1;
        }
    };
    n.clamp(1, cap)
}

/// What the engine decided for the prompt's pass before running it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefillFacts {
    /// The micro-batch the prompt runs in.
    pub ubatch: u32,
    pub(crate) streamed: bool,
    /// The allowance over `--cache-mb` while the prompt runs: the next layer's
    /// experts read ahead (the largest layer), and the compute buffers beyond
    /// those of a [`TARGET_UBATCH`] micro-batch (estimated).
    pub(crate) readahead_allowance_bytes: u64,
    pub(crate) compute_extra_bytes: u64,
}

/// What the prompt's pass cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillReport {
    pub facts: PrefillFacts,
    pub tokens: u64,
    pub(crate) time: Duration,
    /// Streamed only: bytes the flash actor read during the prompt's pass
    /// (read-ahead included), of which read ahead, and the time it waited.
    pub(crate) read_bytes: u64,
    pub readahead_bytes: u64,
    pub(crate) stall: Duration,
    /// Bytes of the distinct (layer, expert) slices the prompt routed to: the
    /// floor of what a prompt must read with a cold cache.
    pub distinct_bytes: u64,
}

impl PrefillReport {
    /// From the prefill's row (the micro-batches folded in one), the bytes of
    /// the distinct slices its decodes routed to, and the engine's facts.
    pub(crate) fn new(row: Option<&TokenRow>, distinct_bytes: u64, facts: PrefillFacts) -> Self {
        let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1e3);
        Self {
            facts,
            tokens: row.map_or(0, |r| r.batch),
            time: row.map_or(Duration::ZERO, |r| ms(r.cost.wall_ms)),
            read_bytes: row.map_or(0, |r| r.reads.read_bytes),
            readahead_bytes: row.map_or(0, |r| r.reads.prefetch_bytes),
            stall: row.map_or(Duration::ZERO, |r| ms(r.cost.stall_ms)),
            distinct_bytes,
        }
    }

    /// Micro-batches the prompt took.
    pub fn micro_batches(&self) -> u32 {
        self.tokens.div_ceil(u64::from(self.facts.ubatch.max(1))) as u32
    }

    pub(crate) fn tok_s(&self) -> f64 {
        let s = self.time.as_secs_f64();
        if s > 0.0 {
            self.tokens as f64 / s
        } else {
            0.0
        }
    }

    /// Bytes read over the distinct routed slices (1.0 is the floor; None
    /// when the prompt routed to nothing, e.g. resident).
    pub fn read_multiple(&self) -> Option<f64> {
        (self.distinct_bytes > 0).then(|| self.read_bytes as f64 / self.distinct_bytes as f64)
    }

    /// The summary's `prefill:` line.
    pub(crate) fn line(&self) -> String {
        if self.tokens == 0 {
            // Stopped inside its first micro-batch (a signal): no row was
            // recorded, while the time and the reads it took were.
            return "prefill: stopped before its first micro-batch ended (the time and the \
                    reads it took are on the generation and moe-stream lines)"
                .into();
        }
        let n = self.micro_batches();
        let plural = if n == 1 { "" } else { "es" };
        let mut s = format!(
            "prefill: {} tokens in {n} micro-batch{plural} of {}: {:.2} s, {:.1} tok/s",
            self.tokens,
            self.facts.ubatch,
            self.time.as_secs_f64(),
            self.tok_s()
        );
        if self.facts.streamed {
            let multiple = self
                .read_multiple()
                .map_or_else(|| "n/a".to_string(), |m| format!("{m:.2}x"));
            s.push_str(&format!(
                "; read {:.1} MiB = {multiple} the {:.1} MiB of distinct routed slices \
                 ({:.1} MiB read ahead), waited {:.2} s; allowance over the cache: \
                 next layer read ahead {:.1} MiB + compute buffers {:.1} MiB",
                self.read_bytes as f64 / MIB,
                self.distinct_bytes as f64 / MIB,
                self.readahead_bytes as f64 / MIB,
                self.stall.as_secs_f64(),
                self.facts.readahead_allowance_bytes as f64 / MIB,
                self.facts.compute_extra_bytes as f64 / MIB,
            ));
        }
        s
    }

    /// The CSV trailer's and `BMOE_DONE`'s prefill pairs.
    pub(crate) fn pairs(&self) -> Vec<(String, String)> {
        let secs = |d: Duration| format!("{:.3}", d.as_secs_f64());
        let mut v = vec![
            ("prefill_s".to_string(), secs(self.time)),
            ("prefill_tok_s".into(), format!("{:.2}", self.tok_s())),
            (
                "prefill_micro_batches".into(),
                self.micro_batches().to_string(),
            ),
        ];
        if self.facts.streamed {
            let multiple = self
                .read_multiple()
                .map_or("NA".into(), |m| format!("{m:.3}"));
            v.push(("prefill_read_bytes".into(), self.read_bytes.to_string()));
            v.push((
                "prefill_distinct_bytes".into(),
                self.distinct_bytes.to_string(),
            ));
            v.push(("prefill_read_multiple".into(), multiple));
            v.push(("prefill_stall_s".into(), secs(self.stall)));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bmoe_decode::telemetry::{Cost, Reads};

    #[test]
    fn auto_runs_the_prompt_in_one_micro_batch_when_it_fits() {
        let all = |_| true;
        assert_eq!(choose_ubatch(Ubatch::Auto, 1384, 2048, all), 1408);
        assert_eq!(choose_ubatch(Ubatch::Auto, 5, 2048, all), 512);
        assert_eq!(choose_ubatch(Ubatch::Auto, 0, 2048, all), 512);
        // Longer than the context allows: equal micro-batches of at most n_ctx.
        assert_eq!(choose_ubatch(Ubatch::Auto, 5000, 4096, all), 2560);
        // A context below the floor caps it.
        assert_eq!(choose_ubatch(Ubatch::Auto, 300, 256, all), 256);
    }

    #[test]
    fn auto_splits_into_more_micro_batches_until_the_buffers_fit() {
        assert_eq!(choose_ubatch(Ubatch::Auto, 2048, 4096, |u| u <= 1024), 1024);
        assert_eq!(choose_ubatch(Ubatch::Auto, 2000, 4096, |u| u <= 700), 512);
        assert_eq!(choose_ubatch(Ubatch::Auto, 2000, 4096, |_| false), 512);
    }

    #[test]
    fn a_fixed_micro_batch_is_capped_by_the_context() {
        assert_eq!(
            choose_ubatch(Ubatch::Fixed(512), 5000, 2048, |_| false),
            512
        );
        assert_eq!(
            choose_ubatch(Ubatch::Fixed(4096), 5000, 2048, |_| true),
            2048
        );
        assert_eq!("auto".parse(), Ok(Ubatch::Auto));
        assert_eq!("64".parse(), Ok(Ubatch::Fixed(64)));
        assert_eq!("16".parse(), Ok(Ubatch::Fixed(16)));
        assert!("8".parse::<Ubatch>().is_err() && "9000".parse::<Ubatch>().is_err());
    }

    #[test]
    fn the_report_says_the_reads_against_the_distinct_slices() {
        let row = TokenRow {
            batch: 1384,
            cost: Cost {
                wall_ms: 2000.0,
                stall_ms: 250.0,
                ..Cost::default()
            },
            reads: Reads {
                read_bytes: 330 * 1024 * 1024,
                prefetch_bytes: 300 * 1024 * 1024,
                ..Reads::default()
            },
            prefill: true,
            ..TokenRow::default()
        };
        let facts = PrefillFacts {
            ubatch: 1408,
            streamed: true,
            readahead_allowance_bytes: 10 * 1024 * 1024,
            compute_extra_bytes: 5 * 1024 * 1024,
        };
        let r = PrefillReport::new(Some(&row), 300 * 1024 * 1024, facts);
        assert_eq!((r.micro_batches(), r.tokens), (1, 1384));
        assert!((r.tok_s() - 692.0).abs() < 1e-9);
        assert!((r.read_multiple().unwrap() - 1.1).abs() < 1e-9);
        let line = r.line();
        assert!(line.starts_with("prefill: 1384 tokens in 1 micro-batch of 1408: 2.00 s, 692.0 tok/s; read 330.0 MiB = 1.10x the 300.0 MiB"), "{line}");
        let pairs = r.pairs();
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("prefill_read_multiple").as_deref(), Some("1.100"));
        assert_eq!(get("prefill_s").as_deref(), Some("2.000"));
        let resident = PrefillReport::new(
            Some(&row),
            0,
            PrefillFacts {
                ubatch: 512,
                ..PrefillFacts::default()
            },
        );
        assert_eq!(resident.micro_batches(), 3);
        assert!(!resident.line().contains("read") && get("prefill_tok_s").is_some());
        assert!(resident
            .pairs()
            .iter()
            .all(|(k, _)| k != "prefill_read_bytes"));
    }
}
