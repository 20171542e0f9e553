//! What a run reports: the one decode rate, the totals of the CSV trailer and
//! the BMOE_DONE line, and the summary lines printed after the answer.

use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use bmoe_actors::cache::Requester;

use super::{PrefetchReport, RunMode, RunReport, Speculation, TokenRow};
use crate::draft::HeadReport;
use crate::generate;
use crate::stream::{StreamConfig, Streamer};

/// The decode rate, one definition everywhere (summary line, CSV trailer,
/// `BMOE_DONE`, `bmoe probe`): the tokens generated after the first, over the
/// wall time from the first token to the last (decodes, drafting, sampling,
/// output and telemetry included: the rate a user sees). 0 when there is no
/// such token or time.
pub fn decode_rate(tokens_after_first: usize, span: Duration) -> f64 {
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
    predicted: (u64, u64),
) -> PrefetchReport {
    let c = s.flash.counters();
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    PrefetchReport {
        layers: sc.prefetch,
        predictive: sc.predict_prefetch,
        read_bytes: ld(&c.read_bytes[Requester::Prefetch.index()]),
        useful_bytes: ld(&c.prefetch_useful_bytes),
        wasted_bytes: ld(&c.prefetch_wasted_bytes),
        hints_dropped: ld(&c.prefetch_hints_dropped),
        errors: ld(&c.prefetch_errors),
        predicted: predicted.0,
        predicted_used: predicted.1,
    }
}

/// A mean that is 0 (never -0 or NaN) over nothing.
fn mean(sum: f64, n: usize) -> f64 {
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
        let decode_ms: f64 = decode.iter().map(|r| r.wall_ms).sum();
        let sum = |f: fn(&TokenRow) -> u64| rows.iter().map(f).sum::<u64>();
        let tok_s = decode_rate(self.generated.saturating_sub(1), self.decode_span);
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
            ("read_bytes_total".into(), sum(|r| r.read_bytes).to_string()),
            ("cache_hits".into(), sum(|r| r.hits).to_string()),
            ("cache_misses".into(), sum(|r| r.misses).to_string()),
            ("evictions".into(), sum(|r| r.evictions).to_string()),
            (
                "stall_s".into(),
                format!(
                    "{:.3}",
                    rows.iter().map(|r| r.stall_ms).sum::<f64>() / 1e3 + 0.0
                ),
            ),
            ("majflt".into(), sum(|r| r.majflt).to_string()),
            (
                "prefetch_bytes".into(),
                sum(|r| r.prefetch_bytes).to_string(),
            ),
            (
                "dropped_experts".into(),
                sum(|r| r.dropped_experts).to_string(),
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

    fn decode_rows(&self) -> impl Iterator<Item = &TokenRow> {
        self.rows.iter().filter(|r| !r.prefill)
    }

    /// Streamed bytes per generated token, over the single-token decodes.
    pub fn decode_bytes_per_token(&self) -> f64 {
        let (n, b) = self
            .decode_rows()
            .fold((0u64, 0u64), |(n, b), r| (n + 1, b + r.read_bytes));
        if n == 0 {
            0.0
        } else {
            b as f64 / n as f64
        }
    }

    /// The summary lines printed on stderr after the answer.
    pub fn summary_lines(&self) -> Vec<String> {
        const MIB: f64 = 1024.0 * 1024.0;
        let g = &self.generation;
        let n = self.decode_rows().count();
        let per_token = |f: fn(&TokenRow) -> f64| mean(self.decode_rows().map(f).sum(), n);
        let stall = per_token(|r| r.stall_ms);
        let io = per_token(|r| r.io_ms);
        let wall = per_token(|r| r.wall_ms);
        let cpu = per_token(|r| r.cpu_ms);
        let majflt = per_token(|r| r.majflt as f64);
        let minflt = per_token(|r| r.minflt as f64);
        let hits: u64 = self.rows.iter().map(|r| r.hits).sum();
        let misses: u64 = self.rows.iter().map(|r| r.misses).sum();
        let evictions: u64 = self.rows.iter().map(|r| r.evictions).sum();
        let stop = match g.stop {
            generate::StopReason::EndOfText => "end of text",
            generate::StopReason::Limit => "token limit",
            generate::StopReason::ContextFull => "context full",
            generate::StopReason::Interrupted => "interrupted",
        };
        let mut v = vec![format!(
            "generation: {} prompt tokens, {} generated ({stop}), prefill {:.0} ms, decode {:.2} tok/s ({:.1} ms/token in the decodes alone)",
            g.prompt_tokens,
            g.tokens.len(),
            g.prefill.as_secs_f64() * 1e3,
            self.decode_tok_s(),
            wall
        )];
        v.push(format!(
            "compute: cpu {:.2} cores busy per decode, major faults/token {majflt:.1}, minor faults/token {minflt:.0}",
            if wall > 0.0 { cpu / wall } else { 0.0 }
        ));
        if self.mode == RunMode::Stream {
            let kernel = self
                .kernel_read_bytes
                .map(|b| format!("{:.1} MiB", b as f64 / MIB))
                .unwrap_or_else(|| "unavailable".into());
            v.push(format!(
                "moe-stream: {}, read {:.1} MiB ({:.2} MiB/token decode), kernel read_bytes {kernel}; \
                 decode {wall:.1} ms/token = flash wait {stall:.1} (io {io:.1}) + compute and cache management {:.1} (residual)",
                self.reader,
                self.flash_read_bytes as f64 / MIB,
                self.decode_bytes_per_token() / MIB,
                (wall - stall).max(0.0)
            ));
            // Per decode: under speculation a verify decode's cost and reads sit on
            // its group's first row (mtp_batch > 0) and its accepted tokens follow.
            let (mut warm_decodes, mut decodes, mut warm_tokens, mut warm_ms) = (0, 0, 0, 0.0);
            let mut in_warm = false;
            for r in self.decode_rows() {
                if self.speculation == Speculation::Off || r.mtp_batch > 0 {
                    decodes += 1;
                    in_warm = r.misses == 0;
                    if in_warm {
                        warm_decodes += 1;
                        warm_ms += r.wall_ms;
                    }
                }
                warm_tokens += in_warm as usize;
            }
            if warm_decodes > 0 && warm_decodes < decodes && warm_ms > 0.0 {
                v.push(format!(
                    "moe-warm: {:.2} tok/s over the {warm_decodes} decodes that needed no read \
                     (after warm-up; {warm_tokens} tokens)",
                    warm_tokens as f64 * 1e3 / warm_ms,
                ));
            }
            let total = hits + misses;
            v.push(format!(
                "moe-cache: budget {:.0} MiB, hit {:.1}% ({hits}/{total}), evictions {evictions}, peak resident {:.1} MiB, \
                 peak RSS during generation {:.1} MiB (dense {:.1} MiB)",
                self.cache_budget_bytes as f64 / MIB,
                if total > 0 { hits as f64 * 100.0 / total as f64 } else { 0.0 },
                self.peak_resident_bytes as f64 / MIB,
                self.peak_rss_bytes as f64 / MIB,
                self.dense_bytes as f64 / MIB,
            ));
        }
        let p = &self.prefetch;
        if self.mode == RunMode::Stream && p.enabled() {
            let mut what = Vec::new();
            if p.layers > 0 {
                what.push(format!("temporal {} layer(s)", p.layers));
            }
            if p.predictive {
                what.push("predictive".to_string());
            }
            let judged = p.useful_bytes + p.wasted_bytes;
            let mut line = format!(
                "moe-prefetch: {}, read ahead {:.1} MiB, useful {:.1} MiB, wasted {:.1} MiB ({:.0}% of judged)",
                what.join(" + "),
                p.read_bytes as f64 / MIB,
                p.useful_bytes as f64 / MIB,
                p.wasted_bytes as f64 / MIB,
                if judged > 0 { p.wasted_bytes as f64 * 100.0 / judged as f64 } else { 0.0 },
            );
            if p.predictive {
                line.push_str(&format!(
                    "; predictor: {} of {} guessed experts routed ({:.1}%)",
                    p.predicted_used,
                    p.predicted,
                    if p.predicted > 0 {
                        p.predicted_used as f64 * 100.0 / p.predicted as f64
                    } else {
                        0.0
                    }
                ));
            }
            if p.hints_dropped > 0 || p.errors > 0 {
                line.push_str(&format!(
                    "; {} hints dropped (channel full), {} failed reads",
                    p.hints_dropped, p.errors
                ));
            }
            v.push(line);
        }
        let dropped: u64 = self.rows.iter().map(|r| r.dropped_experts).sum();
        if self.drop_cold > 0.0 || self.experts_used != self.experts_used_model {
            let routed = self.decode_rows().count() as u64
                * self.experts_used as u64
                * self.layout.n_layer as u64;
            v.push(format!(
                "moe-drop: LOSSY, top-k {} of the model's {}; --drop-cold-experts {}: dropped {dropped} \
                 of {routed} routed experts in decodes ({:.2}/token)",
                self.experts_used,
                self.experts_used_model,
                self.drop_cold,
                mean(dropped as f64, n)
            ));
        }
        if self.speculation != Speculation::Off {
            let sp = &g.spec;
            let decode_ms: f64 = self.decode_rows().map(|r| r.wall_ms).sum();
            let draft_ms = sp.draft.as_secs_f64() * 1e3;
            let emitted = self.decode_rows().count() as f64;
            let reported = if decode_ms > 0.0 {
                emitted * 1e3 / decode_ms
            } else {
                0.0
            };
            let effective = if decode_ms + draft_ms > 0.0 {
                emitted * 1e3 / (decode_ms + draft_ms)
            } else {
                0.0
            };
            let name = self.speculation.name();
            v.push(format!(
                "{name}: draft {}: acceptance {:.1}% ({} of {} drafted), {:.2} tokens per verify \
                 decode ({} tokens / {} decodes), drafted on {} of {} steps",
                self.draft_max,
                if sp.drafted > 0 {
                    sp.accepted as f64 * 100.0 / sp.drafted as f64
                } else {
                    0.0
                },
                sp.accepted,
                sp.drafted,
                if sp.steps > 0 {
                    emitted / sp.steps as f64
                } else {
                    0.0
                },
                emitted,
                sp.steps,
                sp.drafted_steps,
                sp.steps
            ));
            v.push(format!(
                "{name}-cost: drafting {:.3} ms/token; effective {effective:.2} tok/s (reported decode rate {reported:.2})",
                draft_ms / emitted.max(1.0)
            ));
            if self.mode == RunMode::Stream && matches!(self.speculation, Speculation::Mtp { .. }) {
                let total = (self.head_read_bytes + self.verify_read_bytes).max(1) as f64;
                v.push(format!(
                    "mtp-flash: the head (drafting, catch-up and pre-demands) streamed {:.1} MiB \
                     ({:.1}% of head + verify, {:.2} MiB per step), the verify decodes {:.1} MiB \
                     (prefill included; {:.2} MiB per decode, {:.2} rows each)",
                    self.head_read_bytes as f64 / MIB,
                    self.head_read_bytes as f64 * 100.0 / total,
                    self.head_read_bytes as f64 / MIB / (sp.steps.max(1) as f64),
                    self.verify_read_bytes as f64 / MIB,
                    self.verify_read_bytes as f64 / MIB / (sp.steps.max(1) as f64),
                    (sp.steps + sp.drafted) as f64 / (sp.steps.max(1) as f64)
                ));
                let h = &self.head;
                v.push(format!(
                    "mtp-head: on the draft actor: {} demands of its layer, {:.1}% of the \
                     experts it routed already resident, stalled {:.1} ms in all ({:.3} ms per \
                     step); pre-demanded in the background during the verify decodes: \
                     {:.1} MiB in {} requests",
                    h.demands,
                    h.hits as f64 * 100.0 / ((h.hits + h.misses).max(1) as f64),
                    h.stall.as_secs_f64() * 1e3,
                    h.stall.as_secs_f64() * 1e3 / (sp.steps.max(1) as f64),
                    h.predemand_read_bytes as f64 / MIB,
                    h.predemands
                ));
            }
        }
        for n in &self.notes {
            v.push(format!("note: {n}"));
        }
        v
    }
}
