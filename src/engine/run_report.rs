//! What a run produced and measured: its report, its per-token rows and
//! what prefetching did.

use std::time::Duration;

use super::config::SpecConfig;
use super::mode::Mode;
use super::note::Note;
use super::prefill::PrefillReport;
use super::startup::Startup;
use crate::draft::HeadReport;
use crate::generate::Generation;
use crate::layout::MoeLayout;
use bmoe_decode::metrics::PredictorTally;
use bmoe_decode::telemetry::Row;

/// Per-token accounting (row i is the decode that produced token i; row 0 the
/// prefill; under a multi-token decode its whole cost sits on its first row).
pub(crate) type TokenRow = Row;

/// What a run produced and measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub generation: Generation,
    /// From the first token to the last (see [`super::report::decode_rate`]).
    pub(crate) decode_span: Duration,
    /// What speculation was set to and what the MTP head streamed.
    pub(crate) spec: SpecReport,
    pub rows: Vec<TokenRow>,
    /// Where the experts came from: llama.cpp's mapping (`--resident`, or a
    /// dense model) or the flash actor.
    pub mode: Mode<()>,
    pub notes: Vec<Note>,
    /// What the flash actor read, and the kernel's count beside it.
    pub flash: FlashTotals,
    /// The cache's budget and the memory the run held.
    pub memory: MemoryTotals,
    /// Read-ahead: settings and the flash actor's verdicts.
    pub prefetch: PrefetchReport,
    /// `--cache-warm`: what was read ahead and used, and the profile saved.
    pub(crate) warm_lines: Vec<String>,
    pub(crate) experts: ExpertUse,
    pub layout: MoeLayout,
    /// The `BMOE_DONE` JSON object (the same totals as the CSV trailer).
    pub done_line: String,
    /// The load and the time to the first token.
    pub(crate) startup: Startup,
    /// The prompt's pass: its micro-batch, time and (streamed) reads.
    pub prefill: PrefillReport,
}

/// Speculation over a run.
#[derive(Debug, Clone)]
pub(crate) struct SpecReport {
    /// The draft source and width (`Off` and 0 without speculation).
    pub(crate) config: SpecConfig,
    /// Streamed bytes read for the MTP head's passes and for the verify decodes.
    pub(crate) head_read_bytes: u64,
    pub(crate) verify_read_bytes: u64,
    /// The MTP head's streaming on the draft actor (zeros otherwise).
    pub(crate) head: HeadReport,
}

/// The flash actor's reads over a run.
#[derive(Debug, Clone, Default)]
pub struct FlashTotals {
    /// The reader that ran (io_uring, or the fallback and why).
    pub(crate) reader: String,
    /// Bytes over the whole run (prefill included).
    pub read_bytes: u64,
    /// Kernel-reported storage reads of the process over the generation.
    pub(crate) kernel_read_bytes: Option<u64>,
}

/// The memory a run was given and held.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryTotals {
    pub cache_budget_bytes: u64,
    pub(crate) peak_resident_bytes: u64,
    pub(crate) peak_rss_bytes: u64,
}

/// Experts routed per token (after `--n-expert-used`), the model's own
/// count, and the `--drop-cold-experts` threshold (0: off).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpertUse {
    pub(crate) used: u32,
    pub(crate) model: u32,
    pub(crate) drop_cold: f32,
}

/// What prefetching did over a run.
#[derive(Debug, Clone, Default)]
pub struct PrefetchReport {
    /// `--prefetch K` (temporal depth) and `--predict-prefetch`.
    pub(crate) layers: u32,
    pub(crate) predictive: bool,
    /// Bytes read ahead (all of them, including any after the last decode).
    pub read_bytes: u64,
    pub useful_bytes: u64,
    pub wasted_bytes: u64,
    pub(crate) hints_dropped: u64,
    pub(crate) errors: u64,
    /// Predictive: experts guessed and how many the real routing used, per layer.
    pub predicted: PredictorTally,
}

impl PrefetchReport {
    pub(crate) fn enabled(&self) -> bool {
        self.layers > 0 || self.predictive
    }
}
