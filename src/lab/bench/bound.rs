//! The host's physical bound for a model: the resident compute rate and the
//! probed read bandwidth, and the tok/s they allow a run; measured once per
//! round of the matrix, beside the cells it bounds.

use super::host::Conditions;

/// The host's physical limits for this model, from the probe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bound {
    /// Decode tok/s of a resident run without memory pressure (compute bound).
    pub(crate) resident_tok_s: f64,
    /// Random expert-slice read bandwidth, bytes/s, per queue depth, for each
    /// probe set (the slices a group of cells reads).
    pub(crate) read_bytes_per_s: Vec<Vec<(u32, f64)>>,
}

impl Bound {
    /// The best bandwidth probed on `set` at a queue depth not above `depth`
    /// (a reader at depth d can do what it did at any shallower depth; the
    /// shallowest probed depth when all are deeper).
    pub(crate) fn bandwidth_at(&self, set: usize, depth: u32) -> Option<f64> {
        let probed = self.read_bytes_per_s.get(set)?;
        let within = probed
            .iter()
            .filter(|p| p.0 <= depth)
            .map(|p| p.1)
            .reduce(f64::max);
        within.or_else(|| probed.iter().min_by_key(|p| p.0).map(|p| p.1))
    }

    /// The overlapped bound for a run reading `bytes_per_token` at queue depth
    /// `depth` from probe set `set`: min(resident rate, bandwidth / bytes per
    /// token). A run that reads nothing is bound by compute alone.
    pub(crate) fn tok_s(&self, set: usize, depth: u32, bytes_per_token: f64) -> f64 {
        self.read_tok_s(set, depth, bytes_per_token)
            .map_or(self.resident_tok_s, |r| self.resident_tok_s.min(r))
    }

    /// The read bound alone: the probed bandwidth over `bytes_per_token`
    /// (None for a run that reads nothing, or a set without a probe).
    pub(crate) fn read_tok_s(&self, set: usize, depth: u32, bytes_per_token: f64) -> Option<f64> {
        let bw = self.bandwidth_at(set, depth)?;
        (bytes_per_token > 0.0).then(|| bw / bytes_per_token)
    }
}

/// One round's probe step: the bound measured beside that round's cells.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundProbe {
    pub(crate) round: u32,
    pub(crate) bound: Bound,
    /// Seconds the step took (read probe, page-cache warm-up, resident run).
    pub(crate) wall_s: f64,
    pub(crate) conditions: Conditions,
    /// Why its conditions differ from the quietest baseline run's (empty: not flagged),
    /// and what went wrong in it (a failed resident run).
    pub(crate) flags: Vec<String>,
}

/// The probe of `round` among `probes`.
pub(crate) fn of_round(probes: &[RoundProbe], round: u32) -> Option<&RoundProbe> {
    probes.iter().find(|p| p.round == round)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_the_smaller_of_compute_and_bandwidth() {
        let mib = 1024.0 * 1024.0;
        let b = Bound {
            resident_tok_s: 30.0,
            read_bytes_per_s: vec![
                vec![
                    (1, 500.0 * mib),
                    (2, 1700.0 * mib),
                    (4, 1600.0 * mib),
                    (16, 2000.0 * mib),
                ],
                vec![(4, 3400.0 * mib)],
            ],
        };
        // The best at or below the depth (probe noise can make depth 4 < depth 2).
        assert_eq!(b.bandwidth_at(0, 4), Some(1700.0 * mib));
        assert_eq!(b.bandwidth_at(0, 8), Some(1700.0 * mib));
        assert_eq!(b.bandwidth_at(0, 32), Some(2000.0 * mib));
        // Deeper than any probed depth is not assumed: depth 0 (resident) maps to the shallowest.
        assert_eq!(b.bandwidth_at(0, 0), Some(500.0 * mib));
        // 170 MiB/token at 1700 MiB/s -> 10 tok/s, below compute.
        assert!((b.tok_s(0, 4, 170.0 * mib) - 10.0).abs() < 1e-9);
        // Another set's slices read faster: its own bandwidth bounds it.
        assert!((b.tok_s(1, 4, 170.0 * mib) - 20.0).abs() < 1e-9);
        // A set not probed bounds nothing but compute.
        assert_eq!(b.tok_s(2, 4, 170.0 * mib), 30.0);
        // Little read -> compute bound.
        assert_eq!(b.tok_s(0, 4, 1.0 * mib), 30.0);
        assert_eq!(b.tok_s(0, 4, 0.0), 30.0);
        // The read bound alone: none where nothing is read or nothing probed.
        assert!((b.read_tok_s(0, 4, 170.0 * mib).unwrap() - 10.0).abs() < 1e-9);
        assert!((b.read_tok_s(0, 4, 1.0 * mib).unwrap() - 1700.0).abs() < 1e-9);
        assert_eq!(b.read_tok_s(0, 4, 0.0), None);
        assert_eq!(b.read_tok_s(2, 4, 170.0 * mib), None);
    }
}
