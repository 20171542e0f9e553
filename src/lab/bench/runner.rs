//! Running a bench: trace the workload, hold the balloon if asked, run the
//! rounds ([`super::rounds`]: each a probe step that measures the bound, then
//! every cell as a `bmoe run` child process with its own CSV, the host's
//! conditions sampled around each run), flag the disturbed runs and write
//! `summary.md`.
//!
//! Runs are child processes so each starts from the same state (no warm
//! allocator, no shared page cache accounting, its own peak RSS) and a crash
//! or a timeout costs one run, not the matrix.

use std::path::PathBuf;

use super::balloon::{self, Balloon};
use super::env::BenchEnv;
use super::host;
use super::judge::flag_conditions;
use super::probe::resident_rate;
use super::report::{summary_md, utc_now, SummaryInputs};
use super::rounds::run_matrix;
use super::traced;
use super::{
    error::io_err, error::BenchError, plan::BenchOutcome, plan::BenchPlan, summary::summarize,
};
use crate::layout::MoeLayout;
use crate::stream::memory;

const MIB: f64 = 1024.0 * 1024.0;

/// Run the whole bench.
pub fn run_bench(plan: &BenchPlan) -> Result<BenchOutcome, BenchError> {
    let started = utc_now();
    let (runs_dir, prompt_path, layout) = prepare(plan)?;
    let avail0 = memory::mem_available_bytes();
    crate::say!("bench: tracing the workload's routed experts (one unmeasured streamed run)");
    let context: Vec<String> = super::cells::widest_context(&plan.cells)
        .into_iter()
        .flatten()
        .collect();
    let stem = runs_dir.join("workload-trace");
    let files = traced::WorkloadFiles {
        prompt_path: &prompt_path,
        stem: &stem,
    };
    let probe = traced::workload(plan, &layout, files, &context)?;
    let mut env = BenchEnv {
        plan,
        runs_dir,
        prompt_path,
        layout,
        probe,
        device: host::device_of(&plan.model),
        fixed_resident_tok_s: None,
    };
    if plan.ram_limit_mib.is_some() {
        crate::say!("bench: resident compute rate, before the balloon");
        let stem = env.runs_dir.join("probe-resident-0");
        let rate = resident_rate(plan, &env.prompt_path, &stem)?;
        crate::say!("bench: resident compute rate {rate:.2} tok/s");
        env.fixed_resident_tok_s = Some(rate);
    }
    let (balloon, balloon_note) = inflate_balloon(plan)?;
    let mut m = run_matrix(&env, balloon.as_ref())?;
    let balloon_held_at_end = balloon.as_ref().map(Balloon::still_held);
    if let Some(b) = balloon {
        drop(b);
        crate::say!(
            "bench: balloon deflated; MemAvailable {:.0} MiB",
            memory::mem_available_bytes().unwrap_or(0) as f64 / MIB
        );
    }

    flag_conditions(&mut m.results, &mut m.probes);
    let cells = summarize(&plan.cells, &m.results, &m.probes)?;
    let failed_runs = m.results.iter().filter(|r| r.failure.is_some()).count();
    let md = summary_md(&SummaryInputs {
        plan,
        layout: &env.layout,
        probes: &m.probes,
        probe_sets: &env.probe.sets,
        cells: &cells,
        results: &m.results,
        started: &started,
        avail0,
        balloon_note: &balloon_note,
        balloon_held_at_end,
        interrupted: m.interrupted,
        stability: m.stability.as_deref(),
    });
    let summary_path = plan.out_dir.join(SUMMARY_FILE);
    std::fs::write(&summary_path, &md).map_err(io_err("write", &summary_path))?;
    Ok(BenchOutcome {
        summary_path,
        cells,
        failed_runs,
        interrupted: m.interrupted,
    })
}

/// The summary and the prompt, beside `runs/` in the output directory.
const SUMMARY_FILE: &str = "summary.md";
const PROMPT_FILE: &str = "prompt.txt";
/// The files a bench writes directly in its output directory (none of them
/// may be one of its inputs: `bmoe bench` checks before the probe).
pub const FILES_IN_OUT_DIR: [&str; 2] = [SUMMARY_FILE, PROMPT_FILE];

/// Create the runs directory, write the prompt file and open the model's
/// layout, refusing a model without expert tensors.
fn prepare(plan: &BenchPlan) -> Result<(PathBuf, PathBuf, MoeLayout), BenchError> {
    let runs_dir = plan.out_dir.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(io_err("create", &runs_dir))?;
    let prompt_path = plan.out_dir.join(PROMPT_FILE);
    std::fs::write(&prompt_path, &plan.workload.prompt).map_err(io_err("write", &prompt_path))?;
    let layout = MoeLayout::open(&plan.model)
        .map_err(|e| BenchError::Config(format!("open {}: {e}", plan.model.display())))?;
    if !layout.is_moe() {
        return Err(BenchError::Config(format!(
            "{} has no expert tensors: bmoe bench measures streamed MoE models",
            plan.model.display()
        )));
    }
    Ok((runs_dir, prompt_path, layout))
}

/// Inflate the balloon `--ram-limit-mb` asks for, if one is needed; returns it
/// and the summary's note on it.
fn inflate_balloon(plan: &BenchPlan) -> Result<(Option<Balloon>, String), BenchError> {
    let Some(limit) = plan.ram_limit_mib else {
        return Ok((None, String::from("none")));
    };
    let avail = memory::mem_available_bytes().unwrap_or(0);
    let Some(mib) = balloon::size_for_limit(avail, limit) else {
        let note = format!(
            "none needed: MemAvailable {:.0} MiB is already at or below {limit} MiB",
            avail as f64 / MIB
        );
        crate::say!("bench: {note}");
        return Ok((None, note));
    };
    crate::say!("bench: inflating a {mib} MiB balloon to leave about {limit} MiB available");
    let b = Balloon::inflate(mib)?;
    let after = memory::mem_available_bytes().unwrap_or(0) as f64 / MIB;
    let note = format!(
        "{mib} MiB held (oom_score_adj 1000, inflated in {:.1} s); MemAvailable \
         with it: {after:.0} MiB (asked: about {limit} MiB)",
        b.inflate_s
    );
    crate::say!("bench: {note}");
    Ok((Some(b), note))
}
