//! The routes the parsers find, checked as they come (ids in range, one k
//! per layer, a layer once per token), then laid out as trace records with
//! a header sized from a model or from one slot size.

use std::collections::{BTreeSet, HashMap};

use super::types::{ImportError, ImportFormat, Imported, Loc, Summary};
use crate::route_trace::{TraceHeader, TraceRecord, MAX_EXPERTS, MAX_EXPERT_BYTES, MAX_LAYERS};

/// The expert sizes an imported trace gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sizes {
    /// A model's trace header (as `bmoe run --route-trace` writes it): its
    /// experts and slot bytes per layer; k is the data's.
    Like(TraceHeader),
    /// One expert size for every layer routed; `n_expert` given, else the
    /// largest id + 1.
    Flat {
        slot_bytes: u64,
        n_expert: Option<u32>,
        /// Named in the header as the model (the input's file name).
        name: String,
    },
}

impl Sizes {
    /// The experts per layer when known before reading.
    pub(crate) fn n_expert(&self) -> Option<u32> {
        match self {
            Self::Like(h) => Some(h.n_expert),
            Self::Flat { n_expert, .. } => *n_expert,
        }
    }

    /// Layer ids must be below this: the model's layers, or what a trace
    /// holds (so a stray id never sizes a header of billions of layers).
    pub(crate) fn layer_limit(&self) -> (u32, String) {
        match self {
            Self::Like(h) => (
                (h.slot_bytes.len() as u32).min(MAX_LAYERS),
                format!("{} has {} layers", h.model_name, h.slot_bytes.len()),
            ),
            Self::Flat { .. } => (
                MAX_LAYERS,
                format!("a route trace holds {MAX_LAYERS} layers"),
            ),
        }
    }
}

/// One token's routing at one layer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    pub layer: u32,
    pub ids: Vec<u32>,
    pub weights: Option<Vec<f32>>,
}

/// The routes so far, token by token.
pub(crate) struct Collector {
    /// Ids must be below this.
    limit: u32,
    /// Layers must be below this, and why.
    layer_limit: (u32, String),
    tokens: Vec<Vec<Route>>,
    /// Each layer's k, and where it was first seen.
    k: HashMap<u32, (usize, Loc)>,
    /// Whether routes carry weights (set by the first).
    weights: Option<bool>,
    max_id: u32,
}

impl Collector {
    pub fn new(sizes: &Sizes) -> Self {
        Self {
            limit: sizes.n_expert().unwrap_or(MAX_EXPERTS).min(MAX_EXPERTS),
            layer_limit: sizes.layer_limit(),
            tokens: Vec::new(),
            k: HashMap::new(),
            weights: None,
            max_id: 0,
        }
    }

    /// The routes that follow belong to a new token.
    pub fn start_token(&mut self) {
        if self.tokens.last().is_none_or(|t| !t.is_empty()) {
            self.tokens.push(Vec::new());
        }
    }

    /// Add one route of the current token, read at `at`.
    pub fn push(&mut self, route: Route, at: Loc) -> Result<(), ImportError> {
        let bad = |what: String| Err(ImportError::at(at, what));
        if route.ids.is_empty() {
            return bad(format!("layer {} routes no experts", route.layer));
        }
        if route.layer >= self.layer_limit.0 {
            return bad(format!(
                "layer {} out of range: {} (is the layer column the layer's index?)",
                route.layer, self.layer_limit.1
            ));
        }
        if let Some(&id) = route.ids.iter().find(|&&e| e >= self.limit) {
            return bad(format!(
                "expert {id} out of range: {} experts per layer",
                self.limit
            ));
        }
        if let Some(id) = repeated(&route.ids) {
            return bad(format!(
                "expert {id} twice in layer {}'s route: a token routes k distinct experts",
                route.layer
            ));
        }
        if let Some(w) = &route.weights {
            if w.len() != route.ids.len() {
                return bad(format!(
                    "{} router weights for {} expert ids",
                    w.len(),
                    route.ids.len()
                ));
            }
        }
        let has = route.weights.is_some();
        if *self.weights.get_or_insert(has) != has {
            return bad(match has {
                true => "router weights here but not on the routes before".into(),
                false => "no router weights here but on the routes before".into(),
            });
        }
        let (k, first) = *self.k.entry(route.layer).or_insert((route.ids.len(), at));
        if k != route.ids.len() {
            return bad(format!(
                "layer {} routes {} experts here but {k} at {first}: k must not change within a layer",
                route.layer,
                route.ids.len()
            ));
        }
        self.start_if_none();
        let token = self.tokens.last_mut().expect("started above");
        if token.iter().any(|r| r.layer == route.layer) {
            return bad(format!("layer {} twice in one token", route.layer));
        }
        self.max_id = self
            .max_id
            .max(route.ids.iter().copied().max().unwrap_or(0));
        token.push(route);
        Ok(())
    }

    fn start_if_none(&mut self) {
        if self.tokens.is_empty() {
            self.tokens.push(Vec::new());
        }
    }

    /// The trace: header, then each token's demands (and weights) and its end.
    pub fn finish(
        mut self,
        sizes: Sizes,
        format: ImportFormat,
        spelling: String,
    ) -> Result<Imported, ImportError> {
        self.tokens.retain(|t| !t.is_empty());
        if self.tokens.is_empty() {
            return Err(ImportError::at(Loc::Input, "no routes to import (empty?)"));
        }
        let k = self.one_k()?;
        let layers: BTreeSet<u32> = self.k.keys().copied().collect();
        let mut notes = Vec::new();
        let (header, map) = self.header(sizes, k, &layers, &mut notes)?;
        header
            .check()
            .map_err(|e| ImportError::at(Loc::Input, e.to_string()))?;
        let records = self.records(&map);
        let summary = Summary {
            format,
            tokens: self.tokens.len() as u64,
            layers: layers.len() as u32,
            k,
            n_expert: header.n_expert,
            spelling,
            weights: self.weights == Some(true),
            notes,
        };
        Ok(Imported {
            header,
            records,
            summary,
        })
    }

    /// The trace holds one k: every layer must route the same number.
    fn one_k(&self) -> Result<u32, ImportError> {
        let mut ks: Vec<(u32, usize)> = self.k.iter().map(|(&l, &(k, _))| (l, k)).collect();
        ks.sort_unstable();
        let k = ks[0].1;
        match ks.iter().find(|&&(_, other)| other != k) {
            None => Ok(k as u32),
            Some(&(l, other)) => Err(ImportError::at(
                Loc::Input,
                format!(
                    "layer {} routes {k} experts per token but layer {l} {other}: a trace holds one k",
                    ks[0].0
                ),
            )),
        }
    }

    /// The header and the map from the data's layer to the trace's.
    fn header(
        &self,
        sizes: Sizes,
        k: u32,
        layers: &BTreeSet<u32>,
        notes: &mut Vec<String>,
    ) -> Result<(TraceHeader, HashMap<u32, u32>), ImportError> {
        match sizes {
            Sizes::Like(h) => {
                let map = map_layers(&h, layers, notes)?;
                Ok((TraceHeader { k, ..h }, map))
            }
            Sizes::Flat {
                slot_bytes,
                n_expert,
                name,
            } => {
                let n_expert = n_expert.unwrap_or(self.max_id + 1);
                let last = *layers.last().expect("a route was read");
                debug_assert!(last < MAX_LAYERS, "push bounds the layers");
                let slots: Vec<u64> = (0..=last)
                    .map(|l| if layers.contains(&l) { slot_bytes } else { 0 })
                    .collect();
                let model_bytes = slot_bytes
                    .checked_mul(layers.len() as u64)
                    .and_then(|b| b.checked_mul(u64::from(n_expert)))
                    .filter(|&b| b <= MAX_EXPERT_BYTES)
                    .ok_or_else(|| {
                        ImportError::at(
                            Loc::Input,
                            format!(
                                "{slot_bytes} bytes per expert x {n_expert} experts x {} layers \
                                 passes the {MAX_EXPERT_BYTES} bytes a route trace may describe: \
                                 give the real size of one expert",
                                layers.len()
                            ),
                        )
                    })?;
                let header = TraceHeader {
                    n_expert,
                    k,
                    trunk_layers: last + 1,
                    model_bytes,
                    slot_bytes: slots,
                    model_name: name,
                };
                Ok((header, layers.iter().map(|&l| (l, l)).collect()))
            }
        }
    }

    fn records(&self, map: &HashMap<u32, u32>) -> Vec<TraceRecord> {
        let mut out = Vec::new();
        for token in &self.tokens {
            let mut routes: Vec<(u32, &Route)> = token.iter().map(|r| (map[&r.layer], r)).collect();
            routes.sort_by_key(|&(l, _)| l);
            for (layer, r) in routes {
                let ids = r.ids.iter().map(|&e| e as u16).collect();
                out.push(TraceRecord::Demand { layer, ids });
                if let Some(w) = &r.weights {
                    out.push(TraceRecord::Weights {
                        layer,
                        weights: w.clone(),
                    });
                }
            }
            out.push(TraceRecord::DecodeEnd {
                rows: 1,
                outputs: 1,
            });
        }
        out
    }
}

/// An id that appears twice in `ids` (a route's k ids are distinct).
fn repeated(ids: &[u32]) -> Option<u32> {
    let mut seen = BTreeSet::new();
    ids.iter().copied().find(|&id| !seen.insert(id))
}

/// The data's layers on the model's: the same index when each has experts
/// there; else, when the data numbers only the MoE layers (a model with
/// dense layers first), the i-th of them.
fn map_layers(
    h: &TraceHeader,
    layers: &BTreeSet<u32>,
    notes: &mut Vec<String>,
) -> Result<HashMap<u32, u32>, ImportError> {
    let has_experts = |l: u32| h.slot_bytes.get(l as usize).is_some_and(|&b| b > 0);
    if layers.iter().all(|&l| has_experts(l)) {
        return Ok(layers.iter().map(|&l| (l, l)).collect());
    }
    let moe: Vec<u32> = (0..h.trunk_layers.min(h.slot_bytes.len() as u32))
        .filter(|&l| has_experts(l))
        .collect();
    let last = *layers.last().expect("a route was read");
    if (last as usize) < moe.len() {
        notes.push(format!(
            "the input's layers 0..={last} are taken as {}'s MoE layers in order \
             (layer i -> its i-th MoE layer, {} of them from layer {})",
            h.model_name,
            moe.len(),
            moe[0]
        ));
        return Ok(layers.iter().map(|&l| (l, moe[l as usize])).collect());
    }
    let bad = layers.iter().find(|&&l| !has_experts(l)).copied();
    Err(ImportError::at(
        Loc::Input,
        format!(
            "layer {} has no experts in {} ({} MoE layers of {}): is it that model's log?",
            bad.unwrap_or(last),
            h.model_name,
            moe.len(),
            h.slot_bytes.len()
        ),
    ))
}
