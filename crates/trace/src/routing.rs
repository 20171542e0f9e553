//! How a route trace's generation routes, per layer: how skewed the load is
//! over the experts, and how much of a token's routing the previous token
//! already had (what a cache and a temporal prefetch live on).

use std::collections::HashMap;

use crate::replay::Demands;

/// One layer's routing over the generation decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRouting {
    pub layer: u32,
    /// Share of the layer's routings that went to its busiest tenth of the
    /// experts (0.1 when the load is even).
    pub top_decile_share: f64,
    /// Mean share of a decode's experts that the previous decode also used
    /// at this layer (k / n_expert when routing is independent of the past).
    pub repeat_share: f64,
    /// Experts routed at least once.
    pub experts_used: u32,
}

/// Per layer, over the trace's generation demands (prompt decodes route
/// whole batches and say nothing about token-to-token locality).
pub fn layer_routing(d: &Demands, n_expert: u32) -> Vec<LayerRouting> {
    let mut loads: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut repeats: HashMap<u32, (f64, u32)> = HashMap::new();
    let mut previous: HashMap<u32, &[bmoe_flash::cache::SlotKey]> = HashMap::new();
    for demand in d.demands.iter().filter(|x| !x.prompt) {
        let Some(layer) = demand.keys.first().map(|k| k.layer) else {
            continue;
        };
        let load = loads
            .entry(layer)
            .or_insert_with(|| vec![0; n_expert as usize]);
        for k in &demand.keys {
            load[k.expert as usize] += 1;
        }
        if let Some(prev) = previous.insert(layer, &demand.keys) {
            let shared = demand
                .keys
                .iter()
                .filter(|k| prev.binary_search(k).is_ok())
                .count();
            let r = repeats.entry(layer).or_insert((0.0, 0));
            r.0 += shared as f64 / demand.keys.len() as f64;
            r.1 += 1;
        }
    }
    let mut out: Vec<LayerRouting> = loads
        .into_iter()
        .map(|(layer, mut load)| {
            load.sort_unstable_by(|a, b| b.cmp(a));
            let total: u64 = load.iter().sum();
            let decile = (n_expert as usize).div_ceil(10);
            let top: u64 = load[..decile].iter().sum();
            let (sum, n) = repeats.get(&layer).copied().unwrap_or((0.0, 0));
            LayerRouting {
                layer,
                top_decile_share: top as f64 / total.max(1) as f64,
                repeat_share: if n > 0 { sum / f64::from(n) } else { 0.0 },
                experts_used: load.iter().filter(|&&c| c > 0).count() as u32,
            }
        })
        .collect();
    out.sort_by_key(|l| l.layer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::demands;
    use crate::route_trace::TraceRecord;

    fn trace(route: &[[u16; 2]]) -> Vec<TraceRecord> {
        route
            .iter()
            .flat_map(|ids| {
                [
                    TraceRecord::Demand {
                        layer: 0,
                        ids: ids.to_vec(),
                    },
                    TraceRecord::DecodeEnd {
                        rows: 1,
                        outputs: 1,
                    },
                ]
            })
            .collect()
    }

    #[test]
    fn skew_and_repeats_of_a_known_routing() {
        // 10 experts: expert 0 in every token, the other slot rotating 1, 2, 1, 2.
        let d = demands(&trace(&[[0, 1], [0, 2], [0, 1], [0, 2]]));
        let r = layer_routing(&d, 10);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].top_decile_share, 0.5, "expert 0 has half the load");
        assert_eq!(r[0].repeat_share, 0.5, "one of two experts repeats");
        assert_eq!(r[0].experts_used, 3);
    }

    #[test]
    fn prompt_decodes_are_left_out() {
        let mut recs = vec![
            TraceRecord::Demand {
                layer: 0,
                ids: vec![5, 6, 7, 8],
            },
            TraceRecord::DecodeEnd {
                rows: 2,
                outputs: 1,
            },
        ];
        recs.extend(trace(&[[0, 1], [0, 1]]));
        let r = layer_routing(&demands(&recs), 10);
        assert_eq!((r[0].repeat_share, r[0].experts_used), (1.0, 2));
    }
}
