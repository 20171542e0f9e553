//! `bmoe replay TRACE --cache-mb ...`: a route trace through the expert
//! cache's own code at each budget and policy, beside the offline optimum.

use std::fmt::Write as _;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use clap::Args;

use bmoe::stream::CacheSize;
use bmoe_flash::cache::CachePolicy;
use bmoe_trace::replay::{self, Demands, ReplayStats};
use bmoe_trace::route_trace::{TraceError, TraceHeader, TraceReader, TraceRecord};

use super::usage::UsageError;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The route trace (written by `bmoe run --route-trace FILE`).
    pub trace: PathBuf,
    /// Cache budgets: MiB or shares of the model's expert bytes, comma-separated.
    #[arg(
        long,
        value_name = "MIB|P%,...",
        value_delimiter = ',',
        default_value = "10%,25%,50%"
    )]
    pub cache_mb: Vec<bmoe::stream::CacheSize>,
    /// Policies to replay, comma-separated.
    #[arg(
        long,
        value_name = "POLICY,...",
        value_delimiter = ',',
        default_value = "lru,lfu,cycle,learned"
    )]
    pub policy: Vec<bmoe_flash::cache::CachePolicy>,
}

/// Read the trace (a trace cut mid-record, by a run killed mid-decode, is
/// replayed up to its last whole record, with a note), replay, print.
pub fn replay(args: ReplayArgs) -> Result<()> {
    let (header, records, note) = read_trace(&args.trace)?;
    let d = replay::demands(&records);
    if d.demands.is_empty() {
        return Err(UsageError(format!(
            "{} holds no demands: record it with bmoe run --route-trace FILE on a streamed run",
            args.trace.display()
        ))
        .into());
    }
    let budgets = budgets(&args.cache_mb, &header)?;
    let t0 = Instant::now();
    let rows: Vec<Row> = budgets
        .iter()
        .map(|&b| replay_budget(&header, &d, b, &args.policy))
        .collect();
    outln!("{}", describe(&header, &d, &args.trace));
    if let Some(n) = note {
        outln!("note: {n}");
    }
    outln!("{}", routing_line(&header, &d));
    out!("{}", table(&header, &d, &rows));
    outln!(
        "replayed {} budgets x {} policies + the optimum in {:.0} ms",
        budgets.len(),
        args.policy.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

pub(super) fn read_trace(path: &Path) -> Result<(TraceHeader, Vec<TraceRecord>, Option<String>)> {
    let usage = |e: String| UsageError(format!("{}: {e}", path.display()));
    let file = bmoe::user_file::open_regular(path).map_err(|e| usage(e.to_string()))?;
    let mut reader = TraceReader::new(BufReader::new(file)).map_err(|e| usage(e.to_string()))?;
    let mut records = Vec::new();
    loop {
        match reader.next_record() {
            Ok(Some(r)) => records.push(r),
            Ok(None) => return Ok((reader.header().clone(), records, None)),
            Err(TraceError::Truncated { offset }) => {
                let note = format!(
                    "the trace ends mid-record at byte {offset} (its run stopped mid-decode): \
                     replaying the {} whole records before it",
                    records.len()
                );
                return Ok((reader.header().clone(), records, Some(note)));
            }
            Err(e) => return Err(usage(e.to_string()).into()),
        }
    }
}

/// Each `--cache-mb` in bytes (a share resolved against the trace's model).
fn budgets(sizes: &[CacheSize], header: &TraceHeader) -> Result<Vec<u64>, UsageError> {
    let experts = header.expert_bytes();
    sizes
        .iter()
        .map(|s| {
            s.asked_bytes(experts)
                .map(|b| b.min(experts))
                .ok_or_else(|| {
                    UsageError(
                        "replay --cache-mb takes MiB or a share (25%), not auto: auto depends on \
                     the host at run time"
                            .into(),
                    )
                })
        })
        .collect()
}

/// One budget's replays: each policy's, then the optimum's.
struct Row {
    budget_bytes: u64,
    policies: Vec<(CachePolicy, ReplayStats)>,
    optimum: ReplayStats,
}

fn replay_budget(header: &TraceHeader, d: &Demands, budget: u64, policies: &[CachePolicy]) -> Row {
    Row {
        budget_bytes: budget,
        policies: policies
            .iter()
            .map(|&p| (p, replay::replay(header, d, budget, p)))
            .collect(),
        optimum: replay::belady(header, d, budget),
    }
}

fn describe(h: &TraceHeader, d: &Demands, path: &Path) -> String {
    let layers = h.slot_bytes.iter().filter(|&&b| b > 0).count();
    format!(
        "route trace {}: {} ({layers} layers with experts x {} experts, k {}; experts {:.1} MiB), \
         {} decodes: {} prompt tokens, {} generated, {} demands",
        path.display(),
        h.model_name,
        h.n_expert,
        h.k,
        h.expert_bytes() as f64 / MIB,
        d.decodes,
        d.prompt_tokens,
        d.generation_tokens,
        d.demands.len()
    )
}

/// The routing's skew and locality over the generation, as mean (min..max) over layers.
fn routing_line(h: &TraceHeader, d: &Demands) -> String {
    let layers = bmoe_trace::routing::layer_routing(d, h.n_expert);
    if layers.is_empty() {
        return "routing: no generation decodes to describe".into();
    }
    let spread = |f: &dyn Fn(&bmoe_trace::routing::LayerRouting) -> f64| {
        let v: Vec<f64> = layers.iter().map(f).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        format!(
            "{:.0}% ({:.0}..{:.0})",
            mean * 100.0,
            lo * 100.0,
            hi * 100.0
        )
    };
    format!(
        "routing over the generation, mean (min..max) of {} layers: the busiest tenth of the \
         experts takes {} of the routings (10% if even); a token reuses {} of the previous \
         token's experts ({:.0}% if independent); {:.0} of {} experts routed per layer",
        layers.len(),
        spread(&|l| l.top_decile_share),
        spread(&|l| l.repeat_share),
        f64::from(h.k) * 100.0 / f64::from(h.n_expert),
        layers
            .iter()
            .map(|l| f64::from(l.experts_used))
            .sum::<f64>()
            / layers.len() as f64,
        h.n_expert
    )
}

/// The table: per budget, each policy and the optimum, with hit rates over
/// all demands (the run's `moe-cache` hit) and over generation, and MiB read
/// per generated token.
fn table(h: &TraceHeader, d: &Demands, rows: &[Row]) -> String {
    let experts = h.expert_bytes().max(1) as f64;
    let per_token = |s: &ReplayStats| match d.generation_tokens {
        0 => 0.0,
        n => s.generation_read_bytes as f64 / MIB / n as f64,
    };
    let mut out = String::from(
        "| budget | share | policy | hit % | generation hit % | MiB/token (generation) | vs optimum (points) |\n\
         |---:|---:|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let budget = format!("{:.1} MiB", r.budget_bytes as f64 / MIB);
        let share = format!("{:.0}%", r.budget_bytes as f64 * 100.0 / experts);
        let opt = r.optimum.generation_hit_pct();
        let named = r.policies.iter().map(|(p, s)| (p.name(), s));
        for (name, s) in named.chain(std::iter::once(("optimum", &r.optimum))) {
            let _ = writeln!(
                out,
                "| {budget} | {share} | {name} | {:.1} | {:.1} | {:.3} | {:+.1} |",
                s.hit_pct(),
                s.generation_hit_pct(),
                per_token(s),
                s.generation_hit_pct() - opt
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TraceHeader {
        TraceHeader {
            n_expert: 4,
            k: 1,
            trunk_layers: 2,
            slot_bytes: vec![1 << 20; 2],
            model_bytes: 0,
            model_name: "m.gguf".into(),
        }
    }

    #[test]
    fn budgets_resolve_against_the_traces_experts_and_refuse_auto() {
        let h = header();
        let b = budgets(
            &[
                CacheSize::Mib(2),
                CacheSize::Percent(50.0),
                CacheSize::Mib(99),
            ],
            &h,
        );
        assert_eq!(b.unwrap(), vec![2 << 20, 4 << 20, 8 << 20]);
        let e = budgets(&[CacheSize::Auto], &h).unwrap_err();
        assert!(e.0.contains("not auto"), "{e}");
    }

    #[test]
    fn the_table_has_a_line_per_policy_and_the_optimum() {
        let h = header();
        let recs: Vec<TraceRecord> = (0..6)
            .flat_map(|t| {
                [
                    TraceRecord::Demand {
                        layer: t % 2,
                        ids: vec![(t % 3) as u16],
                    },
                    TraceRecord::DecodeEnd {
                        rows: 1,
                        outputs: 1,
                    },
                ]
            })
            .collect();
        let d = replay::demands(&recs);
        let rows = vec![replay_budget(&h, &d, 2 << 20, &CachePolicy::ALL)];
        let t = table(&h, &d, &rows);
        assert_eq!(t.lines().count(), 2 + CachePolicy::ALL.len() + 1, "{t}");
        assert!(t.contains("| 2.0 MiB | 25% | lru |"), "{t}");
        assert!(t.lines().last().unwrap().contains("| optimum |"), "{t}");
        assert!(t.lines().last().unwrap().ends_with("| +0.0 |"), "{t}");
    }
}
