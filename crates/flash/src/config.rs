//! Settings of the flash actor.

use crate::cache::CachePolicy;

/// Settings of the flash actor.
#[derive(Debug, Clone)]
pub struct FlashConfig {
    /// Hard byte budget of the expert cache (0: only the working set).
    pub budget_bytes: u64,
    /// io_uring queue depth (`--io-threads`).
    pub queue_depth: u32,
    /// Read with O_DIRECT (falls back with a note where refused).
    pub o_direct: bool,
    /// Capacity of the request channel.
    pub request_capacity: usize,
    /// Temporal prefetch (`--prefetch K`): after serving layer L, read on idle
    /// queue slots what layers L+1..L+K used the last time they were asked.
    pub prefetch_layers: u32,
    /// A verify demand naming at most this many experts is a single token's
    /// routing: only those are remembered for temporal prefetch and counted
    /// for the warm-start profile (0: every demand is remembered, none counted).
    pub prefetch_max_experts: u32,
    /// Which unpinned slot the cache gives up first (`--cache-policy`).
    pub policy: CachePolicy,
    /// Pages backed ahead of the cache's growth by the toucher thread
    /// (`--pretouch-mb`; 0: none, each fill of a new slot faults its own in).
    pub pretouch_bytes: u64,
}

impl Default for FlashConfig {
    fn default() -> Self {
        Self {
            budget_bytes: 0,
            queue_depth: 4,
            o_direct: true,
            request_capacity: 16,
            prefetch_layers: 0,
            prefetch_max_experts: 0,
            policy: CachePolicy::default(),
            pretouch_bytes: 0,
        }
    }
}
