//! What the read probe reads: the expert slices the bench's own workload
//! routes to, traced by one unmeasured streamed run before the first round.
//! Read-bound cells re-read exactly those slices, so a probe over them sees
//! what they see of the caches below the guest (a probe over the whole file
//! sees less of it, and the cells' "of bound" then passes 100%).

use std::collections::BTreeSet;
use std::path::Path;

use bmoe_actors::route_trace::{TraceReader, TraceRecord};

use super::runner::{run_child, BenchPlan};
use super::BenchError;
use crate::layout::MoeLayout;

/// The probe's slices: the file they are in, its (offset, bytes) slices, and
/// what they are, for the summary.
#[derive(Debug, Clone)]
pub struct ProbeSlices {
    pub file: std::path::PathBuf,
    pub slices: Vec<(u64, u64)>,
    pub what: String,
}

/// Every expert slice of the file holding most expert bytes.
pub fn whole_file(layout: &MoeLayout) -> ProbeSlices {
    let (file, slices) = crate::stream::probe_slices(layout);
    let what = format!("all {} expert slices of the file", slices.len());
    ProbeSlices { file, slices, what }
}

/// Trace the workload (`--cache-mb 0 --route-trace`, the bench's prompt and
/// tokens, `extra` flags such as the cells' widest context) and keep the
/// slices of the (layer, expert) pairs it demanded. Falls back to the whole
/// file, saying why, when the run or its trace fails.
pub fn workload(
    plan: &BenchPlan,
    layout: &MoeLayout,
    (prompt_path, stem): (&Path, &Path),
    extra: &[String],
) -> Result<ProbeSlices, BenchError> {
    let trace = stem.with_extension("trace");
    let mut args = vec![
        "--cache-mb".to_string(),
        "0".into(),
        "--route-trace".into(),
        trace.display().to_string(),
    ];
    args.extend_from_slice(extra);
    let (failure, _) = run_child(plan, &args, prompt_path, plan.tokens, stem)?;
    let pairs = match failure {
        Some(f) => Err(format!("the traced run failed ({f})")),
        None => demanded_pairs(&trace),
    };
    let all = whole_file(layout);
    Ok(match pairs {
        Ok(p) if !p.is_empty() => {
            let slices = slices_of(layout, &all.file, &p);
            let name = stem.file_name().map(|n| n.to_string_lossy().into_owned());
            let what = format!(
                "the {} expert slices ({} layer-expert pairs) the workload routes to, traced by \
                 one unmeasured `--cache-mb 0` run (runs/{}.*)",
                slices.len(),
                p.len(),
                name.unwrap_or_default()
            );
            ProbeSlices {
                file: all.file,
                slices,
                what,
            }
        }
        Ok(_) => with_reason(all, "the traced run demanded nothing"),
        Err(why) => with_reason(all, &why),
    })
}

fn with_reason(mut all: ProbeSlices, why: &str) -> ProbeSlices {
    crate::say!("bench: the probe reads every expert slice: {why}");
    all.what = format!("{} ({why})", all.what);
    all
}

/// The distinct (layer, expert) pairs a route trace demanded.
fn demanded_pairs(trace: &Path) -> Result<BTreeSet<(u32, u32)>, String> {
    let f = std::fs::File::open(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut r = TraceReader::new(std::io::BufReader::new(f)).map_err(|e| e.to_string())?;
    let mut pairs = BTreeSet::new();
    while let Some(rec) = r.next_record().map_err(|e| e.to_string())? {
        if let TraceRecord::Demand { layer, ids } = rec {
            pairs.extend(ids.iter().map(|&e| (layer, u32::from(e))));
        }
    }
    Ok(pairs)
}

/// The slices of `pairs` that lie in `file` (a split model's other shards
/// are not probed, as for the whole-file probe).
fn slices_of(layout: &MoeLayout, file: &Path, pairs: &BTreeSet<(u32, u32)>) -> Vec<(u64, u64)> {
    layout
        .experts
        .iter()
        .filter(|e| layout.shards.get(e.shard).is_some_and(|s| s.path == file))
        .flat_map(|e| {
            pairs
                .iter()
                .filter(move |(l, x)| *l == e.layer && *x < e.n_expert)
                .map(move |&(_, x)| (e.slice_offset(x), e.slice_bytes))
        })
        .collect()
}
