//! What the read probe reads: the expert slices the bench's own workload
//! routes to, traced by one unmeasured streamed run before the first round,
//! and per cache size the slices a run at that size misses on (the trace
//! replayed through the cache code). Read-bound cells re-read exactly those
//! slices, so a probe over them sees what they see of the caches below the
//! guest (a probe over the whole file sees less of it, and a probe over every
//! routed slice more of it than a cell whose misses are few and cold).

use std::path::{Path, PathBuf};

use bmoe_flash::cache::{CachePolicy, SlotKey};
use bmoe_flash::ProbeOrder;
use bmoe_trace::replay;
use bmoe_trace::route_trace::{TraceHeader, TraceReader, TraceRecord};

use super::cells::Cell;
use super::child::run_child;
use super::error::BenchError;
use super::plan::BenchPlan;
use crate::layout::MoeLayout;
use crate::stream::CacheSize;

/// One probe set: the (offset, bytes) slices it reads, in the order the run's
/// generation read them (a slice read twice is listed twice), a short name
/// for tables and what it is, for the summary.
#[derive(Debug, Clone)]
pub(crate) struct ProbeSlices {
    pub(crate) name: String,
    pub(crate) slices: Vec<(u64, u64)>,
    pub(crate) what: String,
}

/// The probe sets and which one bounds each cell (cells' order).
#[derive(Debug, Clone)]
pub(crate) struct ProbePlan {
    /// The file every set's slices are in.
    pub(crate) file: PathBuf,
    /// Set 0 is every routed slice (or the whole file when not traced).
    pub(crate) sets: Vec<ProbeSlices>,
    pub(crate) cell_sets: Vec<usize>,
    /// Traced sets are read in the order the run read them (re-reads as
    /// close together as they were: what the caches below the guest see);
    /// the whole file at random.
    pub(crate) order: ProbeOrder,
}

/// Every expert slice of the file holding most expert bytes, for every cell.
pub(crate) fn whole_file(layout: &MoeLayout, cells: usize) -> ProbePlan {
    let (file, slices) = crate::stream::probe_slices(layout);
    let what = format!("all {} expert slices of the file", slices.len());
    let set = ProbeSlices {
        name: "file".into(),
        slices,
        what,
    };
    ProbePlan {
        file,
        sets: vec![set],
        cell_sets: vec![0; cells],
        order: ProbeOrder::Random { seed: 0x5eed },
    }
}

/// Where the traced run of a workload reads its prompt, and the stem of the
/// files it writes (`STEM.trace`, its CSV).
#[derive(Debug, Clone, Copy)]
pub struct WorkloadFiles<'a> {
    pub prompt_path: &'a Path,
    pub stem: &'a Path,
}

/// Trace the workload (`--cache-mb 0 --route-trace`, the bench's prompt and
/// tokens, `extra` flags such as the cells' widest context) and derive the
/// probe sets from it. Falls back to the whole file, saying why, when the run
/// or its trace fails.
pub fn workload(
    plan: &BenchPlan,
    layout: &MoeLayout,
    files: WorkloadFiles<'_>,
    extra: &[String],
) -> Result<ProbePlan, BenchError> {
    let WorkloadFiles { prompt_path, stem } = files;
    let trace = stem.with_extension("trace");
    let mut args = vec![
        "--cache-mb".to_string(),
        "0".into(),
        "--route-trace".into(),
        trace.display().to_string(),
    ];
    args.extend_from_slice(extra);
    let (failure, _) = run_child(plan, &args, prompt_path, plan.workload.tokens, stem)?;
    let all = whole_file(layout, plan.cells.len());
    let read = match failure {
        Some(f) => Err(format!("the traced run failed ({f})")),
        None => read_trace(&trace),
    };
    let name = stem.file_name().map(|n| n.to_string_lossy().into_owned());
    Ok(match read {
        Ok((header, records)) => {
            let d = replay::demands(&records);
            let sets = SetBuilder {
                layout,
                file: &all.file,
                header: &header,
                demands: &d,
                trace_name: name.unwrap_or_default(),
            };
            match sets.plan(&plan.cells) {
                Some(p) => p,
                None => with_reason(all, "the traced run demanded nothing in generation"),
            }
        }
        Err(why) => with_reason(all, &why),
    })
}

fn with_reason(mut all: ProbePlan, why: &str) -> ProbePlan {
    crate::say!("bench: the probe reads every expert slice: {why}");
    all.sets[0].what = format!("{} ({why})", all.sets[0].what);
    all
}

fn read_trace(trace: &Path) -> Result<(TraceHeader, Vec<TraceRecord>), String> {
    let f = std::fs::File::open(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut r = TraceReader::new(std::io::BufReader::new(f)).map_err(|e| e.to_string())?;
    let mut records = Vec::new();
    while let Some(rec) = r.next_record().map_err(|e| e.to_string())? {
        records.push(rec);
    }
    Ok((r.header().clone(), records))
}

/// What a cell's expert cache is: its `--cache-mb` and `--cache-policy` as
/// `bmoe run` settled them (defaults included); None for a resident cell.
pub(crate) fn cell_cache(cell: &Cell) -> Option<(CacheSize, CachePolicy)> {
    let s = cell.settings.stream.as_ref()?;
    Some((s.cache, s.policy))
}

/// Builds the probe sets from a replayed trace.
struct SetBuilder<'a> {
    layout: &'a MoeLayout,
    file: &'a Path,
    header: &'a TraceHeader,
    demands: &'a replay::Demands,
    trace_name: String,
}

impl SetBuilder<'_> {
    /// Set 0: every generation demand (cache 0, `auto`, resident cells and
    /// cells whose cache holds all they read); then one set per other cache
    /// size and policy with misses. None when generation demanded nothing.
    fn plan(&self, cells: &[Cell]) -> Option<ProbePlan> {
        let all = self.misses(0, CachePolicy::default());
        if all.is_empty() {
            return None;
        }
        let mut sets = vec![self.set("routed".into(), &all, "the workload routes to")];
        // Each cache size and policy, and the set that bounds it (0 when its
        // cache held everything generation read: nothing of its own to probe).
        let mut keys: Vec<((u64, CachePolicy), usize)> = Vec::new();
        let mut cell_sets = Vec::with_capacity(cells.len());
        let experts = self.header.expert_bytes();
        for cell in cells {
            let budget = cell_cache(cell).and_then(|(s, p)| Some((s.asked_bytes(experts)?, p)));
            let key = match budget {
                Some((b, p)) if b > 0 => (b.min(experts), p),
                _ => {
                    cell_sets.push(0);
                    continue;
                }
            };
            let set = match keys.iter().find(|k| k.0 == key) {
                Some(&(_, set)) => set,
                None => {
                    let misses = self.misses(key.0, key.1);
                    let set = match misses.is_empty() {
                        true => 0,
                        false => {
                            let (label, p) = (cache_label(cell), key.1);
                            let name = format!("cache {label} {p}");
                            let what = format!("a {label} {p} cache misses on");
                            sets.push(self.set(name, &misses, &what));
                            sets.len() - 1
                        }
                    };
                    keys.push((key, set));
                    set
                }
            };
            cell_sets.push(set);
        }
        debug_assert!(
            sets.iter().all(|s| !s.slices.is_empty()),
            "no set without reads"
        );
        Some(ProbePlan {
            file: self.file.to_path_buf(),
            sets,
            cell_sets,
            order: ProbeOrder::InOrder,
        })
    }

    fn misses(&self, budget: u64, policy: CachePolicy) -> Vec<SlotKey> {
        replay::generation_misses(self.header, self.demands, budget, policy)
    }

    fn set(&self, name: String, keys: &[SlotKey], what: &str) -> ProbeSlices {
        let slices = slices_of(self.layout, self.file, keys);
        let distinct = {
            let mut k = keys.to_vec();
            k.sort_unstable_by_key(|k| (k.layer, k.expert));
            k.dedup();
            k.len()
        };
        let what = format!(
            "{} reads of expert slices ({distinct} distinct layer-expert pairs) {what}, from a \
             route trace of one unmeasured `--cache-mb 0` run (runs/{}.*)",
            slices.len(),
            self.trace_name
        );
        ProbeSlices { name, slices, what }
    }
}

/// The cell's `--cache-mb` as `bmoe run` takes it (`25%`, `512`, `auto`),
/// for a set's name.
fn cache_label(cell: &Cell) -> String {
    cell.settings
        .stream
        .as_ref()
        .map_or_else(|| "0".to_string(), |s| s.cache.to_string())
}

/// The slices of `keys` (in order, repeats kept) that lie in `file` (a split
/// model's other shards are not probed, as for the whole-file probe).
fn slices_of(layout: &MoeLayout, file: &Path, keys: &[SlotKey]) -> Vec<(u64, u64)> {
    let in_file: Vec<_> = layout
        .experts
        .iter()
        .filter(|e| layout.shards.get(e.shard).is_some_and(|s| s.path == file))
        .collect();
    keys.iter()
        .flat_map(|k| {
            in_file
                .iter()
                .filter(move |e| e.layer == k.layer && k.expert < e.n_expert)
                .map(move |e| (e.slice_offset(k.expert), e.slice_bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::bench::cells::CellSettings;
    use crate::stream::StreamConfig;

    fn cell(stream: Option<StreamConfig>) -> Cell {
        Cell {
            name: "c".into(),
            args: Vec::new(),
            settings: CellSettings {
                n_ctx: 2048,
                stream,
            },
        }
    }

    #[test]
    fn a_cells_cache_is_what_its_settings_say() {
        let sc = StreamConfig {
            cache: CacheSize::Percent(25.0),
            policy: CachePolicy::Lru,
            ..StreamConfig::default()
        };
        assert_eq!(
            cell_cache(&cell(Some(sc.clone()))),
            Some((CacheSize::Percent(25.0), CachePolicy::Lru))
        );
        assert_eq!(cache_label(&cell(Some(sc))), "25%");
        assert_eq!(cache_label(&cell(Some(StreamConfig::default()))), "auto");
        assert_eq!(cell_cache(&cell(None)), None);
    }
}
