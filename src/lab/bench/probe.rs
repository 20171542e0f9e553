//! A round's probe step: the read bandwidth of the model's expert slices at
//! each probe depth and the resident decode rate, which together bound every
//! cell of the round, with the host's conditions while the step ran.

use std::path::Path;
use std::time::Duration;

use super::bound::RoundProbe;
use super::child::run_child;
use super::env::BenchEnv;
use super::host;
use super::traced::ProbePlan;
use super::{bound::Bound, error::io_err, error::BenchError, plan::BenchPlan};
use crate::lab::compare::{self, RunCsv};

const MIB: f64 = 1024.0 * 1024.0;

/// Read bandwidth per probe set and queue depth on the model's expert slices
/// (O_DIRECT, the engine's own reader).
fn probe_bandwidth(
    plan: &BenchPlan,
    probe: &ProbePlan,
) -> Result<Vec<Vec<(u32, f64)>>, BenchError> {
    probe
        .sets
        .iter()
        .map(|set| probe_set(plan, &probe.file, &set.slices, probe.order))
        .collect()
}

/// Read bandwidth per queue depth on `slices` of `file`.
fn probe_set(
    plan: &BenchPlan,
    file: &Path,
    slices: &[(u64, u64)],
    order: bmoe_flash::ProbeOrder,
) -> Result<Vec<(u32, f64)>, BenchError> {
    let mut read = Vec::new();
    for &d in &plan.probe.depths {
        let r = bmoe_flash::probe_read_bandwidth(
            file,
            slices,
            bmoe_flash::ReadSettings {
                queue_depth: d.max(1),
                o_direct: true,
            },
            Duration::from_secs_f64(plan.probe.seconds),
            order,
            &|| crate::interrupt::requested().is_some(),
        )
        .map_err(|e| BenchError::Config(format!("read probe at depth {d}: {e}")))?;
        if let Some(sig) = crate::interrupt::requested() {
            return Err(BenchError::Interrupted(sig));
        }
        read.push((d, r.bytes_per_s()));
    }
    Ok(read)
}

/// The resident decode rate with the whole file in the page cache (a cold
/// cache would make it a disk measurement); the run's files are `stem.*`.
pub(super) fn resident_rate(
    plan: &BenchPlan,
    prompt_path: &Path,
    stem: &Path,
) -> Result<f64, BenchError> {
    super::workload::warm_page_cache(&plan.model).map_err(io_err("read", &plan.model))?;
    let mut args = vec!["--resident".to_string()];
    args.extend(
        super::cells::widest_context(&plan.cells)
            .into_iter()
            .flatten(),
    );
    let (failure, _) = run_child(plan, &args, prompt_path, plan.probe.resident_tokens, stem)?;
    if let Some(f) = failure {
        return Err(BenchError::Config(format!(
            "the resident probe run failed ({f}); see {}",
            stem.with_extension("err").display()
        )));
    }
    let csv = RunCsv::open(&stem.with_extension("csv"))?;
    Ok(compare::figures(&csv)?.rate.tok_s)
}

/// One round's probe step: bandwidth at the probe depths and (without a
/// balloon) the resident rate, with the host's conditions while it ran. A
/// resident run that fails after the first round keeps the previous rate,
/// said in the step's flags.
pub(super) fn probe_round(
    env: &BenchEnv,
    round: u32,
    previous: Option<&RoundProbe>,
) -> Result<RoundProbe, BenchError> {
    let plan = env.plan;
    let before = host::sample(env.device);
    let (read, speeds) = host::with_speed_samples(|| probe_bandwidth(plan, &env.probe));
    let read = read?;
    let stem = env.runs_dir.join(format!("probe-resident-{round}"));
    let mut flags = Vec::new();
    let resident = match (env.fixed_resident_tok_s, previous) {
        (Some(r), _) => r,
        (None, None) => resident_rate(plan, &env.prompt_path, &stem)?,
        (None, Some(p)) => match resident_rate(plan, &env.prompt_path, &stem) {
            Ok(r) => r,
            Err(BenchError::Interrupted(s)) => return Err(BenchError::Interrupted(s)),
            Err(e) => {
                flags.push(format!(
                    "resident run failed ({e}); round {}'s rate used",
                    p.round
                ));
                p.bound.resident_tok_s
            }
        },
    };
    let after = host::sample(env.device);
    Ok(RoundProbe {
        round,
        bound: Bound {
            resident_tok_s: resident,
            read_bytes_per_s: read,
        },
        wall_s: after.at.duration_since(before.at).as_secs_f64(),
        conditions: speeds.onto(host::conditions(&before, &after)),
        flags,
    })
}

/// A probe step's progress line.
pub(super) fn probe_line(p: &RoundProbe) -> String {
    let bw = p
        .bound
        .read_bytes_per_s
        .iter()
        .enumerate()
        .flat_map(|(s, v)| {
            v.iter()
                .map(move |(d, b)| format!("set {s} depth {d} {:.0} MiB/s", b / MIB))
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{bw}; resident {:.2} tok/s ({:.1} s){}",
        p.bound.resident_tok_s,
        p.wall_s,
        p.flags.iter().map(|f| format!("; {f}")).collect::<String>()
    )
}
