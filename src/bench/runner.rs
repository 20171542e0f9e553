//! Running a bench: probe the host, inflate the balloon if asked, run every
//! (cell, repeat) of the schedule as a `bmoe run` child process with its own
//! CSV, show progress, and write `summary.md`.
//!
//! Runs are child processes so each starts from the same state (no warm
//! allocator, no shared page cache accounting, its own peak RSS) and a crash
//! or a timeout costs one run, not the matrix.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::balloon::{self, Balloon};
use super::report::{summary_md, SummaryInputs};
use super::{schedule, summarize, BenchError, Bound, Cell, CellSummary, RunResult};
use crate::compare::{self, RunCsv};
use crate::layout::MoeLayout;
use crate::stream::memory;

const MIB: f64 = 1024.0 * 1024.0;

/// The read probe and resident-rate settings.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    pub depths: Vec<u32>,
    pub seconds: f64,
    /// Tokens of the resident run that measures the compute rate.
    pub resident_tokens: u32,
}

/// Everything a bench needs, resolved and validated by the caller.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// The `bmoe` binary the runs are started from.
    pub exe: PathBuf,
    pub model: PathBuf,
    pub cells: Vec<Cell>,
    /// Where the cells came from (a file or `preset NAME`).
    pub cells_source: String,
    pub workload: String,
    pub prompt: String,
    pub tokens: u32,
    pub repeats: u32,
    pub out_dir: PathBuf,
    /// Emulate a host with about this much available memory.
    pub ram_limit_mib: Option<u64>,
    pub probe: ProbeSettings,
    /// A run longer than this is killed and counted as failed.
    pub run_timeout: Duration,
    /// The bench's own command line, written into the summary.
    pub command_line: String,
}

/// What a finished bench produced.
#[derive(Debug)]
pub struct BenchOutcome {
    pub summary_path: PathBuf,
    pub cells: Vec<CellSummary>,
    pub failed_runs: usize,
    /// The signal that stopped the matrix early, if any.
    pub interrupted: Option<i32>,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::Io { what, path, source }
}

/// The last non-empty line of a file (a failed run's error message).
fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Start one `bmoe run` and wait for it (at most `timeout`).
fn run_child(
    plan: &BenchPlan,
    args: &[String],
    prompt_path: &Path,
    tokens: u32,
    stem: &Path,
) -> Result<(Option<String>, f64), BenchError> {
    let csv = stem.with_extension("csv");
    let out = stem.with_extension("out");
    let err = stem.with_extension("err");
    let t0 = Instant::now();
    let mut child = Command::new(&plan.exe)
        .arg("run")
        .arg("-m")
        .arg(&plan.model)
        .arg("-f")
        .arg(prompt_path)
        .arg("-n")
        .arg(tokens.to_string())
        // Rates are measured over exactly -n tokens, whatever the model says.
        .arg("--ignore-eos")
        .arg("--csv")
        .arg(&csv)
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out).map_err(io_err("create", &out))?)
        .stderr(File::create(&err).map_err(io_err("create", &err))?)
        .spawn()
        .map_err(io_err("start", &plan.exe))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > plan.run_timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(io_err("wait for", &plan.exe)(e)),
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let failure = match status {
        None => Some(format!(
            "killed after the {} s run timeout",
            plan.run_timeout.as_secs()
        )),
        Some(s) if !s.success() => Some(format!("{s}: {}", last_line(&err))),
        Some(_) => None,
    };
    Ok((failure, wall))
}

/// Measure the bound: read bandwidth per queue depth on the model's expert
/// slices, and the resident decode rate (a `--resident` run, no pressure).
pub fn probe_bound(
    plan: &BenchPlan,
    layout: &MoeLayout,
    prompt_path: &Path,
) -> Result<Bound, BenchError> {
    let (file, slices) = crate::stream::probe_slices(layout);
    let mut read = Vec::new();
    for &d in &plan.probe.depths {
        let r = bmoe_actors::flash::probe_read_bandwidth(
            &file,
            &slices,
            d.max(1),
            true,
            Duration::from_secs_f64(plan.probe.seconds),
            0x5eed,
            &|| crate::interrupt::requested().is_some(),
        )
        .map_err(|e| BenchError::Config(format!("read probe at depth {d}: {e}")))?;
        if let Some(sig) = crate::interrupt::requested() {
            return Err(BenchError::Interrupted(sig));
        }
        crate::say!("bench: probe depth {d}: {:.1} MiB/s", r.bytes_per_s() / MIB);
        read.push((d, r.bytes_per_s()));
    }
    // The compute bound is the resident rate with the whole file in the page
    // cache (a cold cache would make it a disk measurement).
    let (bytes, took) = super::warm_page_cache(&plan.model).map_err(io_err("read", &plan.model))?;
    crate::say!(
        "bench: page cache warmed with the model ({:.0} MiB in {:.1} s)",
        bytes as f64 / MIB,
        took.as_secs_f64()
    );
    let stem = plan.out_dir.join("probe-resident");
    let mut args = vec!["--resident".to_string()];
    args.extend(
        super::cells::widest_context(&plan.cells)
            .into_iter()
            .flatten(),
    );
    let (failure, _) = run_child(plan, &args, prompt_path, plan.probe.resident_tokens, &stem)?;
    if let Some(f) = failure {
        return Err(BenchError::Config(format!(
            "the resident probe run failed ({f}); see {}",
            stem.with_extension("err").display()
        )));
    }
    let csv = RunCsv::open(&stem.with_extension("csv"))?;
    let rate = compare::figures(&csv)?.rate.tok_s;
    crate::say!("bench: resident compute rate {rate:.2} tok/s");
    Ok(Bound {
        resident_tok_s: rate,
        read_bytes_per_s: read,
    })
}

/// UTC date and time of now, `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm), days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Run the whole bench.
pub fn run_bench(plan: &BenchPlan) -> Result<BenchOutcome, BenchError> {
    let started = utc_now();
    let (runs_dir, prompt_path, layout) = prepare(plan)?;
    let avail0 = memory::mem_available_bytes();

    crate::say!("bench: probing the host (read bandwidth, resident rate)");
    let bound = probe_bound(plan, &layout, &prompt_path)?;

    let (mut balloon, balloon_note) = inflate_balloon(plan)?;

    let order = schedule(plan.cells.len(), plan.repeats);
    let (results, interrupted) = run_matrix(plan, &order, &runs_dir, &prompt_path, &mut balloon)?;
    let balloon_alive_at_end = balloon.as_mut().map(|b| b.alive());
    drop(balloon);

    let cells = summarize(&plan.cells, &results, Some(&bound))?;
    let failed_runs = results.iter().filter(|r| r.failure.is_some()).count();
    let md = summary_md(&SummaryInputs {
        plan,
        layout: &layout,
        bound: &bound,
        cells: &cells,
        results: &results,
        started: &started,
        avail0,
        balloon_note: &balloon_note,
        balloon_alive_at_end,
        interrupted,
        scheduled: order.len(),
    });
    let summary_path = plan.out_dir.join("summary.md");
    std::fs::write(&summary_path, &md).map_err(io_err("write", &summary_path))?;
    Ok(BenchOutcome {
        summary_path,
        cells,
        failed_runs,
        interrupted,
    })
}

/// Create the runs directory, write the prompt file and open the model's
/// layout, refusing a model without expert tensors.
fn prepare(plan: &BenchPlan) -> Result<(PathBuf, PathBuf, MoeLayout), BenchError> {
    let runs_dir = plan.out_dir.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(io_err("create", &runs_dir))?;
    let prompt_path = plan.out_dir.join("prompt.txt");
    std::fs::write(&prompt_path, &plan.prompt).map_err(io_err("write", &prompt_path))?;
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
    let max_s = plan
        .run_timeout
        .as_secs()
        .saturating_mul((plan.cells.len() as u64 + 1) * (plan.repeats.max(1) as u64 + 1));
    let b = Balloon::inflate(&plan.exe, mib, max_s)?;
    let after = memory::mem_available_bytes().unwrap_or(0) as f64 / MIB;
    let note = format!(
        "{mib} MiB held (oom_score_adj 1000, inflated in {:.1} s); MemAvailable \
         with it: {after:.0} MiB (asked: about {limit} MiB)",
        b.inflate_s
    );
    crate::say!("bench: {note}");
    Ok((Some(b), note))
}

/// Run the schedule's (cell, run) pairs in order, stopping early on a signal;
/// returns the results and the signal, if one stopped it.
fn run_matrix(
    plan: &BenchPlan,
    order: &[(usize, u32)],
    runs_dir: &Path,
    prompt_path: &Path,
    balloon: &mut Option<Balloon>,
) -> Result<(Vec<RunResult>, Option<i32>), BenchError> {
    let mut results: Vec<RunResult> = Vec::new();
    let mut baseline_text: Option<Vec<u8>> = None;
    for (k, &(ci, run)) in order.iter().enumerate() {
        if let Some(sig) = crate::interrupt::requested() {
            return Ok((results, Some(sig)));
        }
        if let Some(b) = balloon.as_mut() {
            if !b.alive() {
                return Err(BenchError::Balloon(
                    "the balloon process died mid-matrix (OOM-killed?); the remaining runs \
                     would not be under the asked memory limit"
                        .into(),
                ));
            }
        }
        let cell = &plan.cells[ci];
        let stem = runs_dir.join(format!("{}-{run}", cell.name));
        let (r, line) = run_cell(plan, ci, run, prompt_path, &stem, &mut baseline_text)?;
        let wall_s = r.wall_s;
        crate::say!(
            "bench: [{}/{}] {} run {run}: {line} ({wall_s:.1} s)",
            k + 1,
            order.len(),
            cell.name
        );
        results.push(r);
    }
    Ok((results, None))
}

/// Run one (cell, run) and judge it: the failure (if any), the CSV, whether
/// its text equals the baseline's; returns it with its progress line.
fn run_cell(
    plan: &BenchPlan,
    ci: usize,
    run: u32,
    prompt_path: &Path,
    stem: &Path,
    baseline_text: &mut Option<Vec<u8>>,
) -> Result<(RunResult, String), BenchError> {
    let (mut failure, wall_s) =
        run_child(plan, &plan.cells[ci].args, prompt_path, plan.tokens, stem)?;
    let csv_path = stem.with_extension("csv");
    let csv = match RunCsv::open(&csv_path) {
        Ok(c) => Some(c),
        Err(e) => {
            failure.get_or_insert_with(|| e.to_string());
            None
        }
    };
    if let (None, Some(c)) = (&failure, &csv) {
        if c.aborted() {
            failure = Some("the run was interrupted (aborted=1 in its CSV)".into());
        }
    }
    let text = std::fs::read(stem.with_extension("out")).ok();
    if ci == 0 && baseline_text.is_none() && failure.is_none() {
        *baseline_text = text.clone();
    }
    let same_text_as_baseline = match (&*baseline_text, &text, &failure) {
        (Some(b), Some(t), None) => Some(b == t),
        _ => None,
    };
    let line = progress_line(failure.as_deref(), csv.as_ref());
    let result = RunResult {
        cell: ci,
        run,
        csv_path,
        csv,
        failure,
        same_text_as_baseline,
        wall_s,
    };
    Ok((result, line))
}

/// A run's figures (or why there are none) for its progress line.
fn progress_line(failure: Option<&str>, csv: Option<&RunCsv>) -> String {
    match (failure, csv.map(compare::figures)) {
        (Some(f), _) => format!("FAILED: {f}"),
        (None, Some(Ok(f))) => format!(
            "{:.2} tok/s [{:.2}-{:.2}], {:.2} MiB/token, hit {}, stall {:.3} s/token",
            f.rate.tok_s,
            f.rate.lo,
            f.rate.hi,
            f.mib_per_token,
            f.hit_pct
                .map(|h| format!("{h:.1}%"))
                .unwrap_or_else(|| "-".into()),
            f.stall_ms_per_token / 1e3
        ),
        (None, Some(Err(e))) => format!("unreadable CSV: {e}"),
        (None, None) => "no CSV".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_now_is_a_plausible_timestamp() {
        let s = super::utc_now();
        assert_eq!(s.len(), "2026-11-30 07:00:00 UTC".len(), "{s}");
        assert!(s.starts_with("20"), "{s}");
        assert!(s.ends_with(" UTC"));
    }
}
