//! The summary lines printed on stderr after the answer: pure functions of a
//! [`RunReport`], one per line family (generation, moe-*, speculation).

use super::mode::Mode;
use super::report::mean;
use super::run_report::{RunReport, TokenRow};
use crate::generate::{SpecStats, StopReason};

const MIB: f64 = 1024.0 * 1024.0;

/// Per generated token, over the single-token decodes (the prefill excluded);
/// times in ms.
pub(super) struct PerToken {
    pub(super) wall: f64,
    pub(super) stall: f64,
    pub(super) io: f64,
    cpu: f64,
    majflt: f64,
    minflt: f64,
}

impl RunReport {
    /// The summary lines printed on stderr after the answer.
    pub fn summary_lines(&self) -> Vec<String> {
        let t = self.per_token();
        let mut v = self.generation_lines(&t);
        if self.mode == Mode::Stream(()) {
            v.extend(self.stream_lines(&t));
            v.extend(self.prefetch_line());
            v.extend(self.predict_line());
            v.extend(self.warm_lines.iter().cloned());
        }
        v.extend(self.drop_line());
        v.extend(self.rpc_line());
        if self.spec.config.is_on() {
            v.extend(self.speculation_lines());
        }
        v.push(self.prefill.line());
        v.push(self.startup.line(self.generation.prefill));
        v.extend(self.notes.iter().map(|n| format!("note: {n}")));
        v
    }

    pub(super) fn per_token(&self) -> PerToken {
        let n = self.decode_rows().count();
        let per_token = |f: fn(&TokenRow) -> f64| mean(self.decode_rows().map(f).sum(), n);
        PerToken {
            wall: per_token(|r| r.cost.wall_ms),
            stall: per_token(|r| r.cost.stall_ms),
            io: per_token(|r| r.cost.io_ms),
            cpu: per_token(|r| r.cost.cpu_ms),
            majflt: per_token(|r| r.cost.majflt as f64),
            minflt: per_token(|r| r.cost.minflt as f64),
        }
    }

    /// `generation:` and `compute:`.
    fn generation_lines(&self, t: &PerToken) -> Vec<String> {
        let g = &self.generation;
        let stop = match g.stop {
            StopReason::EndOfText => "end of text",
            StopReason::Limit => "token limit",
            StopReason::ContextFull => "context full",
            StopReason::Interrupted => "interrupted",
            StopReason::StopString => "stop string",
        };
        vec![
            format!(
                "generation: {} prompt tokens, {} generated ({stop}), prefill {:.0} ms, decode {:.2} tok/s ({:.1} ms/token in the decodes alone)",
                g.prompt_tokens,
                g.tokens.len(),
                g.prefill.as_secs_f64() * 1e3,
                self.decode_tok_s(),
                t.wall
            ),
            format!(
                "compute: cpu {:.2} cores busy per decode, major faults/token {:.1}, minor faults/token {:.0}",
                if t.wall > 0.0 { t.cpu / t.wall } else { 0.0 },
                t.majflt,
                t.minflt
            ),
        ]
    }

    /// `moe-stream:`, `moe-warm:` (when some decodes needed no read) and `moe-cache:`.
    fn stream_lines(&self, t: &PerToken) -> Vec<String> {
        let kernel = self
            .flash
            .kernel_read_bytes
            .map(|b| format!("{:.1} MiB", b as f64 / MIB))
            .unwrap_or_else(|| "unavailable".into());
        let mut v = vec![format!(
            "moe-stream: {}, read {:.1} MiB ({:.2} MiB/token decode), kernel read_bytes {kernel}; \
             decode {:.1} ms/token = flash wait {:.1} (io {:.1}) + compute and cache management {:.1} (residual)",
            self.flash.reader,
            self.flash.read_bytes as f64 / MIB,
            self.decode_bytes_per_token() / MIB,
            t.wall,
            t.stall,
            t.io,
            (t.wall - t.stall).max(0.0)
        )];
        v.extend(self.warm_line());
        v.push(self.cache_line());
        v.extend(bound_line(t, self.decode_bytes_per_token()));
        v
    }

    /// The rate over the decodes that needed no read (after warm-up). Per
    /// decode: under speculation a verify decode's cost and reads sit on its
    /// group's first row (mtp_batch > 0) and its accepted tokens follow.
    fn warm_line(&self) -> Option<String> {
        let (mut warm_decodes, mut decodes, mut warm_tokens, mut warm_ms) = (0, 0, 0, 0.0);
        let mut in_warm = false;
        for r in self.decode_rows() {
            if !self.spec.config.is_on() || r.spec.mtp_batch > 0 {
                decodes += 1;
                in_warm = r.reads.misses == 0;
                if in_warm {
                    warm_decodes += 1;
                    warm_ms += r.cost.wall_ms;
                }
            }
            warm_tokens += in_warm as usize;
        }
        (warm_decodes > 0 && warm_decodes < decodes && warm_ms > 0.0).then(|| {
            format!(
                "moe-warm: {:.2} tok/s over the {warm_decodes} decodes that needed no read \
                 (after warm-up; {warm_tokens} tokens)",
                warm_tokens as f64 * 1e3 / warm_ms,
            )
        })
    }

    fn cache_line(&self) -> String {
        let hits: u64 = self.rows.iter().map(|r| r.reads.hits).sum();
        let misses: u64 = self.rows.iter().map(|r| r.reads.misses).sum();
        let evictions: u64 = self.rows.iter().map(|r| r.reads.evictions).sum();
        let total = hits + misses;
        let decode = self.rows.iter().filter(|r| !r.prefill);
        let (dh, dm) = decode.fold((0, 0), |(h, m), r| (h + r.reads.hits, m + r.reads.misses));
        format!(
            "moe-cache: budget {:.0} MiB, hit {:.1}% ({hits}/{total}), decode hit {:.1}% ({dh}/{}), evictions {evictions}, peak resident {:.1} MiB, \
             peak RSS during generation {:.1} MiB (dense {:.1} MiB)",
            self.memory.cache_budget_bytes as f64 / MIB,
            if total > 0 { hits as f64 * 100.0 / total as f64 } else { 0.0 },
            if dh + dm > 0 { dh as f64 * 100.0 / (dh + dm) as f64 } else { 0.0 },
            dh + dm,
            self.memory.peak_resident_bytes as f64 / MIB,
            self.memory.peak_rss_bytes as f64 / MIB,
            self.layout.dense_bytes() as f64 / MIB,
        )
    }

    /// `moe-prefetch:` (read-ahead on).
    fn prefetch_line(&self) -> Option<String> {
        let p = &self.prefetch;
        if !p.enabled() {
            return None;
        }
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
            let (guessed, used) = p.predicted.total();
            line.push_str(&format!(
                "; predictor: {used} of {guessed} guessed experts routed ({:.1}%)",
                if guessed > 0 {
                    used as f64 * 100.0 / guessed as f64
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
        Some(line)
    }

    /// `moe-predict:` (`--predict-prefetch` guessed): accuracy per layer.
    fn predict_line(&self) -> Option<String> {
        let t = &self.prefetch.predicted;
        (t.total().0 > 0).then(|| {
            format!(
                "moe-predict: guessed experts routed, per layer: {}",
                t.per_layer_line()
            )
        })
    }

    /// `moe-drop:` (a lossy knob on).
    fn drop_line(&self) -> Option<String> {
        if self.experts.drop_cold <= 0.0 && self.experts.used == self.experts.model {
            return None;
        }
        let n = self.decode_rows().count();
        let dropped: u64 = self.rows.iter().map(|r| r.reads.dropped_experts).sum();
        let routed = n as u64 * self.experts.used as u64 * self.layout.n_layer as u64;
        Some(format!(
            "moe-drop: LOSSY, top-k {} of the model's {}; --drop-cold-experts {}: dropped {dropped} \
             of {routed} routed experts in decodes ({:.2}/token)",
            self.experts.used,
            self.experts.model,
            self.experts.drop_cold,
            mean(dropped as f64, n)
        ))
    }

    /// `{source}:`, `{source}-cost:`, and with streamed MTP `mtp-flash:` and `mtp-head:`.
    fn speculation_lines(&self) -> Vec<String> {
        let sp = &self.generation.spec;
        let decode_ms: f64 = self.decode_rows().map(|r| r.cost.wall_ms).sum();
        let draft_ms = sp.draft.as_secs_f64() * 1e3;
        let emitted = self.decode_rows().count() as f64;
        let rate = |ms: f64| if ms > 0.0 { emitted * 1e3 / ms } else { 0.0 };
        let (reported, effective) = (rate(decode_ms), rate(decode_ms + draft_ms));
        let name = self.spec.config.source.name();
        let mut v = vec![
            format!(
                "{name}: draft {}: acceptance {:.1}% ({} of {} drafted), {:.2} tokens per verify \
                 decode ({} tokens / {} decodes), drafted on {} of {} steps",
                self.spec.config.draft_max,
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
            ),
            format!(
                "{name}-cost: drafting {:.3} ms/token; effective {effective:.2} tok/s (reported decode rate {reported:.2})",
                draft_ms / emitted.max(1.0)
            ),
        ];
        v.extend(sp.gate.map(|g| gate_line(&g)));
        if self.mode == Mode::Stream(()) && self.spec.config.source.head().is_some() {
            v.extend(self.mtp_stream_lines(sp));
        }
        v
    }

    /// `mtp-flash:` (the head's bytes against the verify decodes') and `mtp-head:`.
    fn mtp_stream_lines(&self, sp: &SpecStats) -> [String; 2] {
        let steps = sp.steps.max(1) as f64;
        let total = (self.spec.head_read_bytes + self.spec.verify_read_bytes).max(1) as f64;
        let h = &self.spec.head;
        [
            format!(
                "mtp-flash: the head (drafting, catch-up and pre-demands) streamed {:.1} MiB \
                 ({:.1}% of head + verify, {:.2} MiB per step), the verify decodes {:.1} MiB \
                 (prefill included; {:.2} MiB per decode, {:.2} rows each)",
                self.spec.head_read_bytes as f64 / MIB,
                self.spec.head_read_bytes as f64 * 100.0 / total,
                self.spec.head_read_bytes as f64 / MIB / steps,
                self.spec.verify_read_bytes as f64 / MIB,
                self.spec.verify_read_bytes as f64 / MIB / steps,
                (sp.steps + sp.drafted) as f64 / steps
            ),
            format!(
                "mtp-head: on the draft actor: {} demands of its layer, {:.1}% of the \
                 experts it routed already resident, stalled {:.1} ms in all ({:.3} ms per \
                 step); pre-demanded in the background during the verify decodes: \
                 {:.1} MiB in {} requests",
                h.demands,
                h.hits as f64 * 100.0 / ((h.hits + h.misses).max(1) as f64),
                h.stall.as_secs_f64() * 1e3,
                h.stall.as_secs_f64() * 1e3 / steps,
                h.predemand_read_bytes as f64 / MIB,
                h.predemands
            ),
        ]
    }
}

/// `spec-gate:` how often the gate drafted, and why it held back.
fn gate_line(g: &crate::generate::GateStats) -> String {
    let mean_k = match g.drafted_steps {
        0 => 0.0,
        n => g.drafted as f64 / n as f64,
    };
    format!(
        "spec-gate: verified drafts on {} of {} steps ({mean_k:.2} per drafted step, {} of them \
         exploring); held back on {}: {} with nothing to draft, {} where fewer drafts paid more \
         ({} to a plain decode)",
        g.drafted_steps,
        g.steps,
        g.explored,
        g.no_draft + g.shortened,
        g.no_draft,
        g.shortened,
        g.held_to_plain
    ) + &match g.drafted_steps_by {
        [n, m] if n > 0 && m > 0 => {
            format!("; drafted by the n-gram matcher {n}, the MTP head {m}")
        }
        _ => String::new(),
    } + &match g.rested {
        0 => String::new(),
        n => format!(
            "; the MTP head rested (no catch-up) on {n} steps, woke {} times",
            g.woke
        ),
    }
}

/// `moe-bound:` this run's decode against the bounds its own counters set, per
/// token: compute (the time outside flash waits), the reads (their own time for
/// the bytes read) and the overlap of the two (the slower one), with the share
/// of the overlap bound the decode reached. None without a decode.
fn bound_line(t: &PerToken, read_bytes: f64) -> Option<String> {
    let compute_ms = (t.wall - t.stall).max(0.0);
    let overlap_ms = compute_ms.max(t.io);
    (t.wall > 0.0 && overlap_ms > 0.0).then(|| {
        let rate = |ms: f64| format!("{:.2} tok/s", 1e3 / ms);
        let reads = match t.io > 0.0 {
            true => format!(
                "{} ({:.2} MiB/token at their own {:.0} MiB/s)",
                rate(t.io),
                read_bytes / MIB,
                read_bytes / MIB * 1e3 / t.io
            ),
            false => "none".to_string(),
        };
        format!(
            "moe-bound: compute {} ({compute_ms:.1} ms/token), reads {reads}, \
             overlap bound {}: decode at {:.2} of it",
            rate(compute_ms),
            rate(overlap_ms),
            overlap_ms / t.wall,
        )
    })
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
