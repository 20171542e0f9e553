//! One token's accounting ([`Row`]) and its two renderings: a CSV row in
//! [`COLUMNS`] order and the `BMOE_PROGRESS` JSON object.

use super::json::json_string;

/// One token's accounting. Under a multi-token decode (prefill), the whole
/// decode's cost is charged to its first row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub step: u64,
    pub wall_ms: f64,
    pub stall_ms: f64,
    pub io_ms: f64,
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub majflt: u64,
    pub minflt: u64,
    pub cpu_ms: f64,
    /// Tokens in the decode that produced this row (prompt length for the prefill).
    pub batch: u64,
    pub prefill: bool,
    /// Part of `read_bytes` that the flash actor read ahead (prefetch).
    pub prefetch_bytes: u64,
    /// Routed experts skipped by `--drop-cold-experts` (lossy).
    pub dropped_experts: u64,
    /// Speculation: rows of the verify decode that produced this token's group,
    /// on the group's first row (0 on the rest of the group and without speculation).
    pub mtp_batch: u64,
    /// Speculation: time spent drafting before that verify decode (group's first row).
    pub mtp_draft_ms: f64,
    /// Verify-loop time before this decode outside decodes and drafting
    /// (group's first row).
    pub loop_overhead_ms: f64,
    /// The speculation gate (`--spec`, group's first row; zeros otherwise):
    /// drafts the source had, drafts it verified, and the verify decode plus
    /// drafting it predicted (measured: `wall_ms` + `mtp_draft_ms`).
    pub gate_available: u64,
    pub gate_k: u64,
    pub gate_predicted_ms: f64,
    /// Whose draft the gate judged: 1 the n-gram matcher, 2 the MTP head
    /// (`--spec auto` asks the matcher first); 0 without the gate.
    pub gate_source: u64,
    /// `--rpc`: time in the RPC hosts' part of the decode (their layers, the
    /// network both ways), and bytes that crossed the network to and from them.
    pub remote_ms: f64,
    pub net_bytes: u64,
    /// Text this token completed (may be empty inside a multi-byte character).
    pub text: String,
}

impl Row {
    /// Add `other`'s costs and counts (one decode's) to this row: the prefill,
    /// which spans several micro-batches, is one row. Step, flags, the
    /// speculation columns and the text are left as they are.
    pub fn accumulate(&mut self, other: &Row) {
        self.batch += other.batch;
        self.wall_ms += other.wall_ms;
        self.stall_ms += other.stall_ms;
        self.io_ms += other.io_ms;
        self.read_bytes += other.read_bytes;
        self.hits += other.hits;
        self.misses += other.misses;
        self.evictions += other.evictions;
        self.majflt += other.majflt;
        self.minflt += other.minflt;
        self.cpu_ms += other.cpu_ms;
        self.prefetch_bytes += other.prefetch_bytes;
        self.dropped_experts += other.dropped_experts;
        self.remote_ms += other.remote_ms;
        self.net_bytes += other.net_bytes;
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
        format!(
            "{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{:.3},{},{},{},{},{},{:.3},{:.3},{},{},{:.3},{},{:.3},{}",
            self.step,
            self.wall_ms,
            self.stall_ms,
            self.io_ms,
            self.read_bytes,
            self.hits,
            self.misses,
            self.evictions,
            self.majflt,
            self.minflt,
            self.cpu_ms,
            self.batch,
            self.prefill as u8,
            self.prefetch_bytes,
            self.dropped_experts,
            self.mtp_batch,
            self.mtp_draft_ms,
            self.loop_overhead_ms,
            self.gate_available,
            self.gate_k,
            self.gate_predicted_ms,
            self.gate_source,
            self.remote_ms,
            self.net_bytes
        )
    }

    /// The `BMOE_PROGRESS` JSON object.
    pub fn json(&self) -> String {
        let total = self.hits + self.misses;
        let hit_pct = if total == 0 {
            "null".to_string()
        } else {
            format!("{:.1}", self.hits as f64 * 100.0 / total as f64)
        };
        format!(
            "{{\"step\":{},\"wall_ms\":{:.3},\"io_ms\":{:.3},\"stall_ms\":{:.3},\"read_bytes\":{},\"cache_hit_pct\":{},\"majflt\":{},\"cpu_ms\":{:.3},\"text\":{}}}",
            self.step,
            self.wall_ms,
            self.io_ms,
            self.stall_ms,
            self.read_bytes,
            hit_pct,
            self.majflt,
            self.cpu_ms,
            json_string(&self.text)
        )
    }
}
