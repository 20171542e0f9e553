//! The groups of columns a [`Row`](super::Row) holds: a decode's cost, its
//! expert reads, the speculation it ran under and its remote part.

/// What one decode cost: wall, stalled and I/O time, CPU time and the
/// process's page faults since the previous decode.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    pub wall_ms: f64,
    pub stall_ms: f64,
    pub io_ms: f64,
    pub cpu_ms: f64,
    pub majflt: u64,
    pub minflt: u64,
}

impl Cost {
    /// Add another decode's cost.
    pub fn add(&mut self, o: &Cost) {
        self.wall_ms += o.wall_ms;
        self.stall_ms += o.stall_ms;
        self.io_ms += o.io_ms;
        self.cpu_ms += o.cpu_ms;
        self.majflt += o.majflt;
        self.minflt += o.minflt;
    }
}

/// The expert cache's part of one decode.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reads {
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Part of `read_bytes` that the flash actor read ahead (prefetch).
    pub prefetch_bytes: u64,
    /// Routed experts skipped by `--drop-cold-experts` (lossy).
    pub dropped_experts: u64,
}

impl Reads {
    /// Add another decode's reads.
    pub fn add(&mut self, o: &Reads) {
        self.read_bytes += o.read_bytes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.evictions += o.evictions;
        self.prefetch_bytes += o.prefetch_bytes;
        self.dropped_experts += o.dropped_experts;
    }

    /// Hits over lookups, in percent (`None` without a lookup).
    pub fn hit_pct(&self) -> Option<f64> {
        crate::metrics::hit_pct(self.hits, self.misses)
    }
}

/// Speculation's columns, on a verify group's first row (zeros on the rest
/// of the group and without speculation).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Speculation {
    /// Rows of the verify decode that produced this token's group.
    pub mtp_batch: u64,
    /// Time spent drafting before that verify decode.
    pub mtp_draft_ms: f64,
    /// Verify-loop time before this decode outside decodes and drafting.
    pub loop_overhead_ms: f64,
    /// The speculation gate (`--spec`): drafts the source had, drafts it
    /// verified, and the verify decode plus drafting it predicted
    /// (measured: `wall_ms` + `mtp_draft_ms`).
    pub gate_available: u64,
    pub gate_k: u64,
    pub gate_predicted_ms: f64,
    /// Whose draft the gate judged: 1 the n-gram matcher, 2 the MTP head
    /// (`--spec auto` asks the matcher first); 0 without the gate.
    pub gate_source: u64,
}

/// `--rpc`: time in the RPC hosts' part of the decode (their layers, the
/// network both ways), and bytes that crossed the network to and from them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Remote {
    pub remote_ms: f64,
    pub net_bytes: u64,
}

impl Remote {
    /// Add another decode's remote part.
    pub fn add(&mut self, o: &Remote) {
        self.remote_ms += o.remote_ms;
        self.net_bytes += o.net_bytes;
    }
}
