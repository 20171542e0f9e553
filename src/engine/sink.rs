//! The engine's generation sink: per-token rows (wall, stall, I/O, bytes, hits,
//! faults, CPU) from each decode's facts, the text to the caller, the rows to
//! telemetry, and whether to stop (a signal, a failed output).

use std::time::{Duration, Instant};

use bmoe_actors::telemetry::Telemetry;

use super::TokenRow;
use crate::generate::{DecodeStep, GenerationSink};
use crate::stream::{memory, SharedStats};

pub(super) struct Sink<'a, F: FnMut(&str)> {
    pub(super) on_text: F,
    pub(super) stats: Option<SharedStats>,
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
    pub(super) predicted: u64,
    pub(super) predicted_used: u64,
    /// Speculation is on (the mtp_* columns are filled).
    pub(super) speculating: bool,
}

impl<F: FnMut(&str)> Sink<'_, F> {
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
        let s = self
            .stats
            .as_ref()
            .map(|s| s.borrow_mut().take())
            .unwrap_or_default();
        let row = TokenRow {
            wall_ms: step.elapsed.as_secs_f64() * 1e3,
            stall_ms: s.stall.as_secs_f64() * 1e3,
            io_ms: s.io.as_secs_f64() * 1e3,
            read_bytes: s.read_bytes,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            majflt: u.majflt - self.usage.majflt,
            minflt: u.minflt - self.usage.minflt,
            cpu_ms: u.cpu_ms - self.usage.cpu_ms,
            batch: step.n_tokens as u64,
            prefill: step.prefill,
            prefetch_bytes: s.prefetch_bytes,
            dropped_experts: s.dropped,
            mtp_batch: if self.speculating && !step.prefill {
                step.n_tokens as u64
            } else {
                0
            },
            mtp_draft_ms: step.draft.as_secs_f64() * 1e3,
            ..TokenRow::default()
        };
        self.predicted += s.predicted;
        self.predicted_used += s.predicted_used;
        self.usage = u;
        let now = Instant::now();
        if step.prefill {
            self.prefill_done = Some(now);
            let p = self.prefill.get_or_insert_with(TokenRow::default);
            p.prefill = true;
            p.accumulate(&row);
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
