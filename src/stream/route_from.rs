//! `--route-from TRACE`: forced routing. A route trace's routing as a table of
//! tokens (each token's routed ids at every layer the trace routes), and the
//! cursor that hands a run's decodes their rows of it in order, wrapping at
//! the trace's end: the prompt's rows in token order, then each decode's.
//!
//! A trace holds each batch's demands layer by layer; a prompt's batch keeps
//! only its rows with logits through the last layer (llama.cpp drops the
//! others there), so that layer's demand has fewer rows: they are the batch's
//! last rows. A token without a layer's routing (a prompt row cut there) takes
//! that layer's routing of the next token of the trace that has one.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bmoe_trace::route_trace::{TraceError, TraceHeader, TraceReader, TraceRecord};

/// Why a trace cannot force this run's routing (a refusal: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RouteFromError {
    #[error("--route-from {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "--route-from {path} is a trace of another shape ({why}): record one of this model with \
         bmoe run -m {model} --route-trace FILE, or import its log with bmoe trace import --like \
         {model}"
    )]
    Shape {
        path: PathBuf,
        model: PathBuf,
        why: String,
    },
    #[error(
        "--route-from {path} holds no routing{what}: record one with bmoe run --route-trace FILE \
         on a streamed run"
    )]
    Empty { path: PathBuf, what: String },
}

/// A trace's routing, token by token.
#[derive(Debug)]
pub struct ForcedRoutes {
    k: usize,
    /// Trace layer -> its column of `ids` (None: the trace never routes it).
    column: Vec<Option<usize>>,
    columns: usize,
    tokens: usize,
    /// Token-major: tokens x columns x k routed ids.
    ids: Vec<u16>,
}

impl ForcedRoutes {
    /// The table of `records` (a trace with `header`); None when they route nothing.
    pub fn from_records(header: &TraceHeader, records: &[TraceRecord]) -> Option<Self> {
        let k = header.k.max(1) as usize;
        let mut column = vec![None; header.slot_bytes.len()];
        let mut columns = 0;
        for r in records {
            if let TraceRecord::Demand { layer, .. } = r {
                if let Some(c @ None) = column.get_mut(*layer as usize) {
                    *c = Some(columns);
                    columns += 1;
                }
            }
        }
        if columns == 0 {
            return None;
        }
        let mut table = Table {
            routes: ForcedRoutes {
                k,
                column,
                columns,
                tokens: 0,
                ids: Vec::new(),
            },
            present: Vec::new(),
        };
        let mut batch: Vec<(u32, &[u16])> = Vec::new();
        for r in records {
            match r {
                TraceRecord::Demand { layer, ids } => {
                    // Layers run in order within a batch: a layer at or
                    // below the last one starts the next batch.
                    if batch.last().is_some_and(|(l, _)| layer <= l) {
                        table.push_batch(&std::mem::take(&mut batch));
                    }
                    batch.push((*layer, ids));
                }
                TraceRecord::DecodeEnd { .. } => table.push_batch(&std::mem::take(&mut batch)),
                TraceRecord::Weights { .. } => {}
            }
        }
        table.push_batch(&batch);
        Some(table.filled())
    }

    /// Tokens the trace routes (the cursor wraps after them).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Experts routed per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether the trace routes `layer`.
    pub fn routes_layer(&self, layer: u32) -> bool {
        matches!(self.column.get(layer as usize), Some(Some(_)))
    }

    /// Token `token`'s (wrapped) routed ids at `layer`, None when the trace
    /// never routes that layer.
    pub fn row(&self, token: u64, layer: u32) -> Option<&[u16]> {
        let c = (*self.column.get(layer as usize)?)?;
        let t = (token % self.tokens.max(1) as u64) as usize;
        let at = (t * self.columns + c) * self.k;
        self.ids.get(at..at + self.k)
    }
}

/// A forced run's length: a prompt decoded as one batch (its logits give the
/// first generated token), then a single-token decode for each later one
/// (`bmoe run -n N`: N generated, N - 1 decodes after the prompt's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunShape {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
}

impl ForcedRoutes {
    /// The trace a run of `run`'s shape forced from this one would record
    /// (`bmoe run --route-from T --route-trace OUT`): the prompt's batch with
    /// every row at each routed layer but the last, where only its last row
    /// has logits; then one record set per generated token, wrapping at the
    /// trace's end as the cursor does. A model's routed layers are `layers`.
    /// The engine's own trace of such a run is this (checked in the suite).
    pub fn run_records(&self, layers: &[u32], run: RunShape) -> Vec<TraceRecord> {
        let mut out = Vec::new();
        let batch = |first: u64, rows: u32, out: &mut Vec<TraceRecord>| {
            for (i, &layer) in layers.iter().enumerate() {
                let n = if i + 1 == layers.len() { 1 } else { rows };
                let start = first + u64::from(rows - n);
                let ids = (start..first + u64::from(rows))
                    .flat_map(|t| self.row(t, layer).unwrap_or_default().iter().copied())
                    .collect();
                out.push(TraceRecord::Demand { layer, ids });
            }
            out.push(TraceRecord::DecodeEnd { rows, outputs: 1 });
        };
        if run.prompt_tokens > 0 {
            batch(0, run.prompt_tokens, &mut out);
        }
        // The prompt's batch gives the first token; each later one takes a decode.
        for t in 0..u64::from(run.generated_tokens.saturating_sub(1)) {
            batch(u64::from(run.prompt_tokens) + t, 1, &mut out);
        }
        out
    }
}

/// A table being built: which (token, column) cells a demand filled.
struct Table {
    routes: ForcedRoutes,
    present: Vec<bool>,
}

impl Table {
    /// One batch's demands: its rows are those of its widest demand; a
    /// narrower one (the last layer of a prompt) holds the last rows.
    fn push_batch(&mut self, batch: &[(u32, &[u16])]) {
        let r = &mut self.routes;
        let rows = batch.iter().map(|(_, ids)| ids.len() / r.k).max();
        let Some(rows) = rows.filter(|&n| n > 0) else {
            return;
        };
        let base = r.tokens;
        r.tokens += rows;
        r.ids.resize(r.tokens * r.columns * r.k, 0);
        self.present.resize(r.tokens * r.columns, false);
        for &(layer, ids) in batch {
            let Some(Some(c)) = r.column.get(layer as usize).copied() else {
                continue;
            };
            let n = ids.len() / r.k;
            for (j, row) in ids.chunks_exact(r.k).enumerate() {
                let cell = (base + rows - n + j) * r.columns + c;
                r.ids[cell * r.k..(cell + 1) * r.k].copy_from_slice(row);
                self.present[cell] = true;
            }
        }
    }

    /// Every cell a demand left empty takes its column's next filled cell
    /// (after the last token, the first filled one: the trace wraps).
    fn filled(mut self) -> ForcedRoutes {
        let r = &mut self.routes;
        let (k, columns) = (r.k, r.columns);
        for c in 0..columns {
            let filled = |t: usize| self.present[t * columns + c];
            let Some(mut src) = (0..r.tokens).find(|&t| filled(t)) else {
                continue;
            };
            for t in (0..r.tokens).rev() {
                if filled(t) {
                    src = t;
                } else {
                    let from = (src * columns + c) * k;
                    r.ids.copy_within(from..from + k, (t * columns + c) * k);
                }
            }
        }
        self.routes
    }
}

/// Why a trace's routing does not fit the model `model` describes (its
/// layers with experts, experts per layer, experts per token); None when it
/// does. Slot sizes may differ: another quantization routes alike.
pub fn shape_differs(trace: &TraceHeader, model: &TraceHeader) -> Option<String> {
    let moe = |h: &TraceHeader| -> Vec<usize> {
        let n = h.slot_bytes.len().min(h.trunk_layers as usize);
        (0..n).filter(|&l| h.slot_bytes[l] > 0).collect()
    };
    let shape = |h: &TraceHeader| {
        format!(
            "{} MoE layers of {}, {} experts, k {}",
            moe(h).len(),
            h.trunk_layers,
            h.n_expert,
            h.k
        )
    };
    let same = trace.n_expert == model.n_expert
        && trace.k == model.k
        && trace.trunk_layers == model.trunk_layers
        && moe(trace) == moe(model);
    (!same).then(|| {
        format!(
            "the trace has {} ({}), this run {} ({})",
            shape(trace),
            trace.model_name,
            shape(model),
            model.model_name
        )
    })
}

/// Read the trace at `path` (whole records: one cut mid-record forces what
/// is whole) and check it against the run's own trace header `model`.
pub fn load(
    path: &Path,
    model_path: &Path,
    model: &TraceHeader,
) -> Result<ForcedRoutes, RouteFromError> {
    let unreadable = |reason: String| RouteFromError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let file = crate::user_file::open_regular(path).map_err(|e| unreadable(e.to_string()))?;
    let mut reader =
        TraceReader::new(BufReader::new(file)).map_err(|e| unreadable(e.to_string()))?;
    if let Some(why) = shape_differs(reader.header(), model) {
        return Err(RouteFromError::Shape {
            path: path.to_path_buf(),
            model: model_path.to_path_buf(),
            why,
        });
    }
    let mut records = Vec::new();
    loop {
        match reader.next_record() {
            Ok(Some(r)) => records.push(r),
            Ok(None) | Err(TraceError::Truncated { .. }) => break,
            Err(e) => return Err(unreadable(e.to_string())),
        }
    }
    let empty = |what: String| RouteFromError::Empty {
        path: path.to_path_buf(),
        what,
    };
    let routes = ForcedRoutes::from_records(reader.header(), &records)
        .ok_or_else(|| empty(String::new()))?;
    let trunk = model.slot_bytes.len().min(model.trunk_layers as usize);
    let unrouted =
        (0..trunk as u32).find(|&l| model.slot_bytes[l as usize] > 0 && !routes.routes_layer(l));
    match unrouted {
        Some(l) => Err(empty(format!(
            " at layer {l} (a trace of a run with --rpc holds only the layers streamed there)"
        ))),
        None => Ok(routes),
    }
}

/// Hands a run's decodes their rows of the trace: a decode's rows are the
/// tokens after the previous decode's, wrapping at the trace's end.
#[derive(Debug)]
pub(crate) struct RouteCursor {
    routes: Arc<ForcedRoutes>,
    /// The trace token of the current decode's first row.
    first: u64,
    /// The current decode's rows.
    rows: u32,
}

impl RouteCursor {
    pub(crate) fn new(routes: Arc<ForcedRoutes>) -> Self {
        Self {
            routes,
            first: 0,
            rows: 0,
        }
    }

    pub(crate) fn k(&self) -> usize {
        self.routes.k
    }

    /// A decode of `rows` tokens begins.
    pub(crate) fn decode_begin(&mut self, rows: u32) {
        self.rows = rows;
    }

    /// The decode ended: the next one starts after its rows.
    pub(crate) fn decode_end(&mut self) {
        self.first += u64::from(std::mem::take(&mut self.rows));
    }

    /// The routed ids of a demand of `n` rows at `layer`, row after row, into
    /// `out`: the decode's last `n` rows (all of them but in a prompt's last
    /// layer). Err is the layer, one the trace never routes.
    pub(crate) fn fill(&self, layer: u32, n: usize, out: &mut Vec<u16>) -> Result<(), u32> {
        out.clear();
        let start = self.first + (self.rows as usize).saturating_sub(n) as u64;
        for i in 0..n as u64 {
            let row = self.routes.row(start + i, layer).ok_or(layer)?;
            out.extend_from_slice(row);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "route_from_tests.rs"]
mod tests;
