//! One token's accounting ([`Row`]) and its two renderings: a CSV row in
//! [`COLUMNS`] order and the `BMOE_PROGRESS` JSON object.

use super::json::json_string;
use super::parts::{Cost, Reads, Remote, Speculation};

/// One token's accounting. Under a multi-token decode (prefill), the whole
/// decode's cost is charged to its first row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub step: u64,
    /// Tokens in the decode that produced this row (prompt length for the prefill).
    pub batch: u64,
    pub prefill: bool,
    pub cost: Cost,
    pub reads: Reads,
    pub spec: Speculation,
    pub remote: Remote,
    /// Text this token completed (may be empty inside a multi-byte character).
    pub text: String,
}

impl Row {
    /// Add `other`'s costs and counts (one decode's) to this row: the prefill,
    /// which spans several micro-batches, is one row. Step, flags, the
    /// speculation columns and the text are left as they are.
    pub fn accumulate(&mut self, other: &Row) {
        self.batch += other.batch;
        self.cost.add(&other.cost);
        self.reads.add(&other.reads);
        self.remote.add(&other.remote);
    }
}

/// The CSV columns, in order.
pub const COLUMNS: [&str; 24] = [
    "step",
    "wall_ms",
    "stall_ms",
    "io_ms",
    "read_bytes",
    "cache_hits",
    "cache_misses",
    "evictions",
    "majflt",
    "minflt",
    "cpu_ms",
    "batch",
    "prefill",
    "prefetch_bytes",
    "dropped_experts",
    "mtp_batch",
    "mtp_draft_ms",
    "loop_overhead_ms",
    "gate_available",
    "gate_k",
    "gate_predicted_ms",
    "gate_source",
    "remote_ms",
    "net_bytes",
];

impl Row {
    /// The CSV row, in [`COLUMNS`] order.
    pub(super) fn csv(&self) -> String {
        let (c, r, s, m) = (&self.cost, &self.reads, &self.spec, &self.remote);
        format!(
            "{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{:.3},{},{},{},{},{},{:.3},{:.3},{},{},{:.3},{},{:.3},{}",
            self.step,
            c.wall_ms,
            c.stall_ms,
            c.io_ms,
            r.read_bytes,
            r.hits,
            r.misses,
            r.evictions,
            c.majflt,
            c.minflt,
            c.cpu_ms,
            self.batch,
            self.prefill as u8,
            r.prefetch_bytes,
            r.dropped_experts,
            s.mtp_batch,
            s.mtp_draft_ms,
            s.loop_overhead_ms,
            s.gate_available,
            s.gate_k,
            s.gate_predicted_ms,
            s.gate_source,
            m.remote_ms,
            m.net_bytes
        )
    }

    /// The `BMOE_PROGRESS` JSON object.
    pub fn json(&self) -> String {
        let hit_pct = self
            .reads
            .hit_pct()
            .map_or("null".to_string(), |p| format!("{p:.1}"));
        let c = &self.cost;
        format!(
            "{{\"step\":{},\"wall_ms\":{:.3},\"io_ms\":{:.3},\"stall_ms\":{:.3},\"read_bytes\":{},\"cache_hit_pct\":{},\"majflt\":{},\"cpu_ms\":{:.3},\"text\":{}}}",
            self.step,
            c.wall_ms,
            c.io_ms,
            c.stall_ms,
            self.reads.read_bytes,
            hit_pct,
            c.majflt,
            c.cpu_ms,
            json_string(&self.text)
        )
    }
}
