//! The engine's generation sink: per-token rows (wall, stall, I/O, bytes, hits,
//! faults, CPU) from each decode's facts, the text to the caller, the rows to
//! telemetry, and whether to stop (a signal, a failed output).

use std::time::{Duration, Instant};

use bmoe_decode::metrics::PredictorTally;
use bmoe_decode::telemetry::{Cost, Reads, Remote, Speculation, Telemetry};

use super::run_report::TokenRow;
use crate::generate::{DecodeStep, GenerationSink};
use crate::stream::memory;

pub(super) struct Sink<'a, F: FnMut(&str)> {
    pub(super) on_text: F,
    pub(super) rows: &'a mut Vec<TokenRow>,
    pub(super) telemetry: Option<&'a Telemetry>,
    pub(super) usage: memory::Usage,
    /// Prefill chunks folded into the first token's row.
    pub(super) prefill: Option<TokenRow>,
    /// The last decode's row, collecting the text of the token it produced.
    pub(super) pending: Option<TokenRow>,
    /// When the prefill's last decode ended (the first token is known then).
    pub(super) prefill_done: Option<Instant>,
    /// When the decode of the pending row ended, and of the last row kept.
    pub(super) pending_done: Option<Instant>,
    pub(super) kept_done: Option<Instant>,
    /// Predictive prefetch: experts guessed and guesses the routing used.
    pub(super) predicted: PredictorTally,
    /// Speculation is on (the mtp_* columns are filled).
    pub(super) speculating: bool,
    /// Bytes of the distinct expert slices the prefill's decodes routed to.
    pub(super) prefill_distinct_bytes: u64,
}

impl<'a, F: FnMut(&str)> Sink<'a, F> {
    /// A sink with nothing measured yet; `speculating` fills the mtp_* columns.
    pub(super) fn new(
        on_text: F,
        rows: &'a mut Vec<TokenRow>,
        telemetry: &'a Telemetry,
        speculating: bool,
    ) -> Self {
        Self {
            on_text,
            rows,
            telemetry: Some(telemetry),
            usage: memory::usage(),
            prefill: None,
            pending: None,
            prefill_done: None,
            pending_done: None,
            kept_done: None,
            predicted: PredictorTally::default(),
            speculating,
            prefill_distinct_bytes: 0,
        }
    }

    /// The row of the token whose text is complete goes to the list and the telemetry actor.
    pub(super) fn flush(&mut self) {
        if let Some(p) = self.prefill.take() {
            self.push(p);
        }
        if let Some(r) = self.pending.take() {
            self.push(r);
            self.kept_done = self.pending_done;
        }
    }

    /// The end-of-text token's decode produced no token: its row is dropped.
    pub(super) fn drop_pending(&mut self) {
        self.pending = None;
        self.pending_done = None;
    }

    /// From the first token to the last kept one (see [`decode_rate`]).
    pub(super) fn decode_span(&self) -> Duration {
        match (self.prefill_done, self.kept_done) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        }
    }

    fn push(&mut self, mut row: TokenRow) {
        row.step = self.rows.len() as u64;
        if let Some(t) = self.telemetry {
            t.row(row.clone());
        }
        self.rows.push(row);
    }
}

impl<F: FnMut(&str)> GenerationSink for Sink<'_, F> {
    fn text(&mut self, piece: &str) {
        (self.on_text)(piece);
        if let Some(p) = self.prefill.take() {
            self.pending = Some(p);
        }
        if let Some(r) = self.pending.as_mut() {
            r.text.push_str(piece);
        }
    }

    fn decoded(&mut self, step: DecodeStep) {
        let u = memory::usage();
        let row = decode_row(&step, &u, &self.usage, self.speculating);
        let s = &step.metrics;
        self.predicted.merge(&s.predicted);
        self.usage = u;
        let now = Instant::now();
        if step.prefill {
            self.prefill_done = Some(now);
            let p = self.prefill.get_or_insert_with(TokenRow::default);
            p.prefill = true;
            p.accumulate(&row);
            self.prefill_distinct_bytes += s.first_seen_bytes;
        } else {
            self.flush();
            self.pending = Some(row);
            self.pending_done = Some(now);
        }
    }

    fn next_token(&mut self) {
        // One more token of the same verify decode: its cost stays on the
        // group's first row, this row carries only the token's text.
        self.flush();
        self.pending = Some(TokenRow::default());
    }

    fn should_stop(&mut self) -> bool {
        crate::interrupt::requested().is_some()
            || self.telemetry.is_some_and(|t| t.write_failed())
            || crate::stdio::stdout_failed().is_some()
    }
}

/// The telemetry row of one decode: its step's timing and streaming metrics,
/// and the process's fault and CPU counters since the previous decode.
fn decode_row(
    step: &DecodeStep,
    now: &memory::Usage,
    before: &memory::Usage,
    speculating: bool,
) -> TokenRow {
    let m = &step.metrics;
    TokenRow {
        batch: step.n_tokens as u64,
        prefill: step.prefill,
        cost: Cost {
            wall_ms: step.elapsed.as_secs_f64() * 1e3,
            stall_ms: m.stall.as_secs_f64() * 1e3,
            io_ms: m.io.as_secs_f64() * 1e3,
            cpu_ms: now.cpu_ms - before.cpu_ms,
            majflt: now.majflt - before.majflt,
            minflt: now.minflt - before.minflt,
        },
        reads: Reads {
            read_bytes: m.read_bytes,
            hits: m.hits,
            misses: m.misses,
            evictions: m.evictions,
            prefetch_bytes: m.prefetch_bytes,
            dropped_experts: m.dropped,
        },
        spec: speculation_columns(step, speculating),
        remote: Remote {
            remote_ms: m.remote.as_secs_f64() * 1e3,
            net_bytes: m.net_bytes,
        },
        ..TokenRow::default()
    }
}

/// The speculation columns of one decode (`mtp_batch` only while speculating).
fn speculation_columns(step: &DecodeStep, speculating: bool) -> Speculation {
    Speculation {
        mtp_batch: if speculating && !step.prefill {
            step.n_tokens as u64
        } else {
            0
        },
        mtp_draft_ms: step.draft.as_secs_f64() * 1e3,
        loop_overhead_ms: step.loop_overhead.as_secs_f64() * 1e3,
        gate_available: step.gate.map_or(0, |g| g.available as u64),
        gate_k: step.gate.map_or(0, |g| g.choice.k as u64),
        gate_predicted_ms: step.gate.map_or(0.0, |g| g.choice.predicted_s * 1e3),
        gate_source: step.gate.map_or(0, |g| g.source as u64 + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bmoe_decode::metrics::DecodeMetrics;

    #[test]
    fn a_decode_row_carries_the_steps_metrics_and_the_counter_deltas() {
        let step = DecodeStep {
            n_tokens: 3,
            prefill: false,
            elapsed: Duration::from_millis(40),
            draft: Duration::from_millis(5),
            loop_overhead: Duration::from_micros(250),
            gate: None,
            metrics: DecodeMetrics {
                stall: Duration::from_millis(12),
                io: Duration::from_millis(9),
                read_bytes: 4096,
                hits: 7,
                misses: 2,
                evictions: 1,
                prefetch_bytes: 1024,
                dropped: 1,
                ..DecodeMetrics::default()
            },
        };
        let before = memory::Usage {
            majflt: 10,
            minflt: 100,
            cpu_ms: 1000.0,
        };
        let now = memory::Usage {
            majflt: 13,
            minflt: 150,
            cpu_ms: 1030.0,
        };
        let r = decode_row(&step, &now, &before, true);
        assert_eq!(
            (r.cost.wall_ms, r.cost.stall_ms, r.cost.io_ms),
            (40.0, 12.0, 9.0)
        );
        assert_eq!(
            (
                r.reads.read_bytes,
                r.reads.hits,
                r.reads.misses,
                r.reads.evictions
            ),
            (4096, 7, 2, 1)
        );
        assert_eq!((r.cost.majflt, r.cost.minflt, r.cost.cpu_ms), (3, 50, 30.0));
        assert_eq!(
            (r.batch, r.spec.mtp_batch, r.spec.mtp_draft_ms),
            (3, 3, 5.0)
        );
        assert_eq!(r.spec.loop_overhead_ms, 0.25);
        assert_eq!((r.reads.prefetch_bytes, r.reads.dropped_experts), (1024, 1));
        assert!(!r.prefill);
        let plain = decode_row(&step, &now, &before, false);
        assert_eq!(plain.spec.mtp_batch, 0, "no speculation: no mtp_batch");
    }
}
