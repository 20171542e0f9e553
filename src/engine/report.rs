//! What a run reports: the one decode rate, the totals of the CSV trailer and
//! the BMOE_DONE line, and the summary lines printed after the answer.

use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use bmoe_decode::metrics::PredictorTally;
use bmoe_flash::cache::Requester;

use super::run_report::{PrefetchReport, RunReport, TokenRow};
use crate::draft::HeadReport;
use crate::generate;
use crate::stream::{StreamConfig, Streamer};

/// The decode rate, one definition everywhere (summary line, CSV trailer,
/// `BMOE_DONE`, `bmoe probe`): the tokens generated after the first, over the
/// wall time from the first token to the last (decodes, drafting, sampling,
/// output and telemetry included: the rate a user sees). 0 when there is no
/// such token or time.
pub(crate) fn decode_rate(tokens_after_first: usize, span: Duration) -> f64 {
    if tokens_after_first == 0 || span.is_zero() {
        return 0.0;
    }
    tokens_after_first as f64 / span.as_secs_f64()
}

/// The MTP head's streaming, as trailer pairs (zeros without a head).
pub(super) fn head_pairs(head: &HeadReport, head_read_bytes: u64) -> Vec<(String, String)> {
    vec![
        ("mtp_head_read_bytes".into(), head_read_bytes.to_string()),
        (
            "mtp_head_stall_s".into(),
            format!("{:.6}", head.stall.as_secs_f64()),
        ),
        ("mtp_head_hits".into(), head.hits.to_string()),
        ("mtp_head_misses".into(), head.misses.to_string()),
        (
            "mtp_head_predemand_bytes".into(),
            head.predemand_read_bytes.to_string(),
        ),
    ]
}

/// The flash actor's reader, cache budget, bytes read and peak resident bytes
/// (llama.cpp's mmap and zeros for a resident run).
pub(super) fn flash_facts(streamer: Option<&Streamer>) -> (String, u64, u64, u64) {
    match streamer {
        Some(s) => {
            let c = s.flash.counters();
            (
                s.flash.reader_description().to_string(),
                s.budget_bytes,
                c.read_bytes_total(),
                c.peak_resident_bytes.load(Ordering::Relaxed),
            )
        }
        None => ("llama.cpp mmap".into(), 0, 0, 0),
    }
}

/// What read-ahead did: the settings and the flash actor's verdicts, with the
/// predictor's (guessed, used) experts.
pub(super) fn prefetch_report(
    s: &Streamer,
    sc: &StreamConfig,
    predicted: PredictorTally,
) -> PrefetchReport {
    let c = s.flash.counters();
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    PrefetchReport {
        layers: sc.prefetch,
        predictive: sc.predict_prefetch,
        read_bytes: ld(&c.read_bytes[Requester::Prefetch.index()]),
        useful_bytes: ld(&c.prefetch.useful_bytes),
        wasted_bytes: ld(&c.prefetch.wasted_bytes),
        hints_dropped: ld(&c.prefetch.hints_dropped),
        errors: ld(&c.prefetch.errors),
        predicted,
    }
}

/// A mean that is 0 (never -0 or NaN) over nothing.
pub(super) fn mean(sum: f64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum / n as f64 + 0.0
    }
}

/// What the CSV trailer and the BMOE_DONE line total up.
pub(super) struct Totals<'a> {
    pub(super) rows: &'a [TokenRow],
    /// Tokens generated (what the summary line says).
    pub(super) generated: usize,
    pub(super) prompt_tokens: usize,
    pub(super) elapsed: Duration,
    /// From the first token to the last (see [`decode_rate`]).
    pub(super) decode_span: Duration,
    pub(super) aborted: bool,
    pub(super) dropped_events: u64,
    pub(super) peak_rss_bytes: u64,
    pub(super) spec: &'a generate::SpecStats,
}

impl Totals<'_> {
    /// The pairs, in order (values are JSON).
    pub(super) fn pairs(&self) -> Vec<(String, String)> {
        let rows = self.rows;
        let (elapsed, spec) = (self.elapsed, self.spec);
        let decode: Vec<&TokenRow> = rows.iter().filter(|r| !r.prefill).collect();
        let decode_ms: f64 = decode.iter().map(|r| r.cost.wall_ms).sum();
        let sum = |f: fn(&TokenRow) -> u64| rows.iter().map(f).sum::<u64>();
        let tok_s = decode_rate(self.generated.saturating_sub(1), self.decode_span);
        let per_token = self.generated.max(1) as f64;
        let compute_tok_s = 1e3 / mean(decode_ms, decode.len()).max(f64::MIN_POSITIVE);
        let compute_tok_s = if decode.is_empty() {
            0.0
        } else {
            compute_tok_s
        };
        vec![
            ("tokens".into(), self.generated.to_string()),
            ("prompt_tokens".into(), self.prompt_tokens.to_string()),
            ("decode_tok_s".into(), format!("{tok_s:.3}")),
            ("decode_compute_tok_s".into(), format!("{compute_tok_s:.3}")),
            ("wall_s".into(), format!("{:.3}", elapsed.as_secs_f64())),
            (
                "read_bytes_total".into(),
                sum(|r| r.reads.read_bytes).to_string(),
            ),
            ("cache_hits".into(), sum(|r| r.reads.hits).to_string()),
            ("cache_misses".into(), sum(|r| r.reads.misses).to_string()),
            ("evictions".into(), sum(|r| r.reads.evictions).to_string()),
            (
                "stall_s".into(),
                format!(
                    "{:.3}",
                    rows.iter().map(|r| r.cost.stall_ms).sum::<f64>() / 1e3 + 0.0
                ),
            ),
            ("majflt".into(), sum(|r| r.cost.majflt).to_string()),
            (
                "prefetch_bytes".into(),
                sum(|r| r.reads.prefetch_bytes).to_string(),
            ),
            (
                "dropped_experts".into(),
                sum(|r| r.reads.dropped_experts).to_string(),
            ),
            ("peak_rss_bytes".into(), self.peak_rss_bytes.to_string()),
            ("mtp_drafted".into(), spec.drafted.to_string()),
            ("mtp_accepted".into(), spec.accepted.to_string()),
            ("mtp_decodes".into(), spec.steps.to_string()),
            ("drafted_steps".into(), spec.drafted_steps.to_string()),
            (
                "mtp_draft_s".into(),
                format!("{:.6}", spec.draft.as_secs_f64()),
            ),
            (
                "mtp_draft_s_per_tok".into(),
                format!(
                    "{:.6}",
                    spec.draft.as_secs_f64() / (rows.len().max(1) as f64)
                ),
            ),
            // The same per generated token, under the reference engine's names.
            (
                "mtp_draft_s_tok".into(),
                format!("{:.6}", spec.draft.as_secs_f64() / per_token),
            ),
            (
                "loop_overhead_s".into(),
                format!("{:.6}", spec.loop_overhead.as_secs_f64()),
            ),
            (
                "loop_overhead_s_tok".into(),
                format!("{:.6}", spec.loop_overhead.as_secs_f64() / per_token),
            ),
            ("aborted".into(), (self.aborted as u8).to_string()),
            ("dropped_events".into(), self.dropped_events.to_string()),
        ]
    }
}

impl RunReport {
    /// The decode rate (see [`decode_rate`]).
    pub fn decode_tok_s(&self) -> f64 {
        decode_rate(
            self.generation.tokens.len().saturating_sub(1),
            self.decode_span,
        )
    }

    pub(super) fn decode_rows(&self) -> impl Iterator<Item = &TokenRow> {
        self.rows.iter().filter(|r| !r.prefill)
    }

    /// Per generated token, over the single-token decodes: the wall time, the
    /// flash wait in it, the reads' own time and bytes (None without a
    /// decode). What `inspect --forecast`'s decode probe calibrates with.
    pub fn decode_split(&self) -> Option<DecodeSplit> {
        let n = self.decode_rows().count();
        let t = self.per_token();
        (n > 0).then(|| DecodeSplit {
            tokens: n as u32,
            wall_s: t.wall / 1e3,
            flash_wait_s: t.stall / 1e3,
            io_s: t.io / 1e3,
            read_bytes: self.decode_bytes_per_token(),
        })
    }

    /// Streamed bytes per generated token, over the single-token decodes.
    pub(crate) fn decode_bytes_per_token(&self) -> f64 {
        let (n, b) = self
            .decode_rows()
            .fold((0u64, 0u64), |(n, b), r| (n + 1, b + r.reads.read_bytes));
        if n == 0 {
            0.0
        } else {
            b as f64 / n as f64
        }
    }
}

/// A run's decodes per generated token (see [`RunReport::decode_split`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeSplit {
    pub tokens: u32,
    pub wall_s: f64,
    pub flash_wait_s: f64,
    pub io_s: f64,
    pub read_bytes: f64,
}

impl DecodeSplit {
    /// The decode's time outside flash waits (compute and cache management).
    pub fn compute_s(&self) -> f64 {
        (self.wall_s - self.flash_wait_s).max(0.0)
    }

    /// The reads' own rate (0 when nothing was read).
    pub fn read_bytes_per_s(&self) -> f64 {
        if self.io_s > 0.0 {
            self.read_bytes / self.io_s
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::SpecStats;
    use bmoe_decode::telemetry::{Cost, Reads};

    #[test]
    fn the_trailer_totals_the_rows_and_rates_the_decodes() {
        let row = |prefill, wall_ms, read_bytes, hits, misses| TokenRow {
            prefill,
            cost: Cost {
                wall_ms,
                stall_ms: 10.0,
                ..Cost::default()
            },
            reads: Reads {
                read_bytes,
                hits,
                misses,
                ..Reads::default()
            },
            ..TokenRow::default()
        };
        let rows = [
            row(true, 100.0, 4096, 0, 4),
            row(false, 50.0, 1024, 3, 1),
            row(false, 30.0, 0, 4, 0),
        ];
        let spec = SpecStats {
            steps: 2,
            drafted: 3,
            accepted: 1,
            ..SpecStats::default()
        };
        let pairs = Totals {
            rows: &rows,
            generated: 3,
            prompt_tokens: 7,
            elapsed: Duration::from_millis(500),
            decode_span: Duration::from_millis(100),
            aborted: true,
            dropped_events: 0,
            peak_rss_bytes: 1 << 20,
            spec: &spec,
        }
        .pairs();
        let v = |k: &str| {
            let p = pairs.iter().find(|(key, _)| key == k);
            p.map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k}"))
        };
        // 2 tokens after the first over 100 ms; the decodes alone 40 ms each.
        assert_eq!(v("decode_tok_s"), "20.000");
        assert_eq!(v("decode_compute_tok_s"), "25.000");
        assert_eq!((v("tokens"), v("prompt_tokens")), ("3".into(), "7".into()));
        assert_eq!(v("read_bytes_total"), "5120");
        assert_eq!(
            (v("cache_hits"), v("cache_misses")),
            ("7".into(), "5".into())
        );
        assert_eq!(v("stall_s"), "0.030");
        assert_eq!(
            (v("mtp_drafted"), v("mtp_accepted")),
            ("3".into(), "1".into())
        );
        assert_eq!(v("aborted"), "1");
        assert_eq!(v("wall_s"), "0.500");
    }
}
