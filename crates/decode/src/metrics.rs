//! What one decode cost, as the streaming hook measured it ([`DecodeMetrics`]).
//!
//! The value travels one way: the hook inside the llama.cpp context fills it
//! during a decode, the context hands it out after the decode, the generation
//! loop attaches it to its step, and the engine's sink turns it into the
//! token's telemetry row. No side channel, no shared cell.

use std::time::Duration;

/// The streaming cost of the decodes since the last hand-out (one decode on
/// the verify context; a drafting pass's decodes on the MTP head's context).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DecodeMetrics {
    /// Time the decode waited for expert reads.
    pub stall: Duration,
    /// Time the flash actor spent reading for those demands.
    pub io: Duration,
    /// Bytes read for this decode (read-ahead bytes included).
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Demands made (one per routed layer).
    pub demands: u64,
    /// Bytes the flash actor read ahead (prefetch); also in `read_bytes`.
    pub prefetch_bytes: u64,
    /// Routed experts skipped by `--drop-cold-experts`.
    pub dropped: u64,
    /// Predictive prefetch: experts guessed, and how many the real routing used.
    pub predicted: PredictorTally,
    /// Every demand's layer and experts, in order (only from a hook that logs
    /// its routing: the MTP head's, whose drafting pass predicts its catch-up).
    pub routed: Vec<(u32, Vec<u32>)>,
    /// Bytes of the (layer, expert) slices this decode's batch demanded that
    /// no batch since the last single-token decode had: over a prompt's
    /// micro-batches, the distinct slices the prompt routed to.
    pub first_seen_bytes: u64,
    /// `--rpc`: time from the end of the last local layer to the end of the
    /// decode (the RPC hosts' layers, the network both ways, the logits back).
    pub remote: Duration,
    /// `--rpc`: bytes that crossed the network to and from the RPC hosts.
    pub net_bytes: u64,
}

impl DecodeMetrics {
    /// Add `other`'s counters and times (its routing log is appended).
    pub fn add(&mut self, other: DecodeMetrics) {
        self.stall += other.stall;
        self.io += other.io;
        self.read_bytes += other.read_bytes;
        self.hits += other.hits;
        self.misses += other.misses;
        self.evictions += other.evictions;
        self.demands += other.demands;
        self.prefetch_bytes += other.prefetch_bytes;
        self.dropped += other.dropped;
        self.predicted.merge(&other.predicted);
        self.routed.extend(other.routed);
        self.first_seen_bytes += other.first_seen_bytes;
        self.remote += other.remote;
        self.net_bytes += other.net_bytes;
    }

    /// The distinct experts demanded at `layer`, sorted.
    pub fn experts_at(&self, layer: u32) -> Vec<u32> {
        let mut union: Vec<u32> = self
            .routed
            .iter()
            .filter(|(l, _)| *l == layer)
            .flat_map(|(_, e)| e.iter().copied())
            .collect();
        union.sort_unstable();
        union.dedup();
        union
    }
}

/// Predictive prefetch's record, per layer: experts guessed for the layer
/// and how many of them its routing used.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PredictorTally {
    /// Index: the layer guessed. (guessed, used).
    pub by_layer: Vec<(u64, u64)>,
}

impl PredictorTally {
    /// `guessed` experts were guessed for `layer`, `used` of them routed.
    pub fn add(&mut self, layer: u32, guessed: u64, used: u64) {
        debug_assert!(used <= guessed);
        let i = layer as usize;
        if self.by_layer.len() <= i {
            self.by_layer.resize(i + 1, (0, 0));
        }
        self.by_layer[i].0 += guessed;
        self.by_layer[i].1 += used;
    }

    pub fn merge(&mut self, other: &PredictorTally) {
        for (l, &(g, u)) in other.by_layer.iter().enumerate() {
            if g > 0 {
                self.add(l as u32, g, u);
            }
        }
    }

    /// (guessed, used) over every layer.
    pub fn total(&self) -> (u64, u64) {
        self.by_layer
            .iter()
            .fold((0, 0), |(g, u), &(lg, lu)| (g + lg, u + lu))
    }

    /// Accuracy per guessed layer: "L1 81% L2 77% ..." (layers never guessed
    /// left out).
    pub fn per_layer_line(&self) -> String {
        let cells: Vec<String> = self
            .by_layer
            .iter()
            .enumerate()
            .filter(|(_, &(g, _))| g > 0)
            .map(|(l, &(g, u))| format!("L{l} {:.0}%", u as f64 * 100.0 / g as f64))
            .collect();
        cells.join(" ")
    }
}

/// Hits over lookups (hits and misses), in percent; `None` without a lookup.
pub fn hit_pct(hits: u64, misses: u64) -> Option<f64> {
    let total = hits + misses;
    (total > 0).then(|| hits as f64 * 100.0 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_pct_is_hits_over_lookups_and_none_without_one() {
        assert_eq!(hit_pct(0, 0), None);
        assert_eq!(hit_pct(3, 1), Some(75.0));
        assert_eq!(hit_pct(0, 5), Some(0.0));
    }

    #[test]
    fn add_sums_every_counter_and_appends_the_routing() {
        let mut a = DecodeMetrics {
            stall: Duration::from_millis(2),
            read_bytes: 10,
            hits: 1,
            routed: vec![(3, vec![5, 1])],
            ..DecodeMetrics::default()
        };
        let b = DecodeMetrics {
            stall: Duration::from_millis(3),
            io: Duration::from_millis(1),
            read_bytes: 5,
            misses: 2,
            evictions: 1,
            demands: 4,
            prefetch_bytes: 5,
            dropped: 1,
            predicted: PredictorTally {
                by_layer: vec![(0, 0), (8, 6)],
            },
            hits: 2,
            routed: vec![(3, vec![1, 7]), (4, vec![0])],
            first_seen_bytes: 9,
            remote: Duration::from_millis(7),
            net_bytes: 11,
        };
        a.add(b);
        assert_eq!(a.stall, Duration::from_millis(5));
        assert_eq!((a.remote, a.net_bytes), (Duration::from_millis(7), 11));
        assert_eq!(a.io, Duration::from_millis(1));
        assert_eq!(
            (a.read_bytes, a.hits, a.misses, a.evictions, a.demands),
            (15, 3, 2, 1, 4)
        );
        assert_eq!(
            (a.prefetch_bytes, a.dropped, a.predicted.total()),
            (5, 1, (8, 6))
        );
        assert_eq!(a.routed.len(), 3);
        assert_eq!(a.first_seen_bytes, 9);
        assert_eq!(a.experts_at(3), vec![1, 5, 7]);
        assert_eq!(a.experts_at(4), vec![0]);
        assert!(a.experts_at(9).is_empty());
    }

    #[test]
    fn predictor_tally_keeps_layers_apart_and_totals_them() {
        let mut t = PredictorTally::default();
        t.add(2, 4, 3);
        t.add(1, 4, 1);
        t.add(2, 4, 4);
        let mut u = PredictorTally::default();
        u.add(3, 8, 2);
        t.merge(&u);
        assert_eq!(t.total(), (20, 10));
        assert_eq!(t.by_layer[2], (8, 7));
        assert_eq!(t.per_layer_line(), "L1 25% L2 88% L3 25%");
        assert_eq!(PredictorTally::default().per_layer_line(), "");
    }
}
