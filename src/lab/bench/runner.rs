//! Running a bench: hold the balloon if asked, run the rounds (each a
//! probe step that measures the bound, then every cell as a `bmoe run` child
//! process with its own CSV), the host's conditions sampled around each run,
//! show progress, and write `summary.md`.
//!
//! Runs are child processes so each starts from the same state (no warm
//! allocator, no shared page cache accounting, its own peak RSS) and a crash
//! or a timeout costs one run, not the matrix.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::balloon::{self, Balloon};
use super::bound::RoundProbe;
use super::child;
use super::host;
use super::neighbour::Neighbour;
use super::report::{summary_md, SummaryInputs};
use super::traced::{self, ProbePlan};
use super::{summarize, BenchError, Bound, Cell, CellSummary, RunResult};
use crate::lab::compare::{self, RunCsv};
use crate::layout::MoeLayout;
use crate::stream::memory;

const MIB: f64 = 1024.0 * 1024.0;

/// The read probe and resident-rate settings.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    pub depths: Vec<u32>,
    pub seconds: f64,
    /// Tokens of the resident run that measures the compute rate (the
    /// bench's -n: a shorter run pays more of its first-touch faults per token).
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
    /// `--until-stable`: add rounds until the ratios are this narrow.
    pub until_stable: Option<UntilStable>,
    /// Self-test of the conditions flags: runs (1-based, in the order they
    /// run) that get a busy neighbour beside them.
    pub busy_neighbour_runs: Vec<usize>,
}

impl BenchPlan {
    /// The most rounds the matrix may run (the baseline's extra round aside).
    pub fn max_rounds(&self) -> u32 {
        let repeats = self.repeats.max(1);
        self.until_stable
            .map_or(repeats, |s| s.max_rounds.max(repeats))
    }
}

/// `--until-stable WIDTH --max-repeats N`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UntilStable {
    /// The widest 95% interval of a ratio to the baseline accepted, relative
    /// to the ratio ((hi − lo) / ratio).
    pub width: f64,
    pub max_rounds: u32,
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
pub(super) fn run_child(
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
    let mut child = child::dies_with_parent(&mut Command::new(&plan.exe))
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
    order: bmoe_actors::flash::ProbeOrder,
) -> Result<Vec<(u32, f64)>, BenchError> {
    let mut read = Vec::new();
    for &d in &plan.probe.depths {
        let r = bmoe_actors::flash::probe_read_bandwidth(
            file,
            slices,
            (d.max(1), true),
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
fn resident_rate(plan: &BenchPlan, prompt_path: &Path, stem: &Path) -> Result<f64, BenchError> {
    super::warm_page_cache(&plan.model).map_err(io_err("read", &plan.model))?;
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
fn probe_round(
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

/// What every step of a bench reads: the plan, where its files go, the
/// model's layout and device, and the resident rate fixed before a balloon.
struct BenchEnv<'a> {
    plan: &'a BenchPlan,
    runs_dir: PathBuf,
    prompt_path: PathBuf,
    layout: MoeLayout,
    /// What the read probe reads (the workload's routed slices, and per cache
    /// size the slices it misses on, when traced) and which set bounds each cell.
    probe: ProbePlan,
    device: Option<(u32, u32)>,
    /// Measured once before the balloon: under it the page cache cannot hold
    /// the model and a resident run would be a disk measurement.
    fixed_resident_tok_s: Option<f64>,
}

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
    let probe = traced::workload(plan, &layout, (&prompt_path, &stem), &context)?;
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
    let summary_path = plan.out_dir.join("summary.md");
    std::fs::write(&summary_path, &md).map_err(io_err("write", &summary_path))?;
    Ok(BenchOutcome {
        summary_path,
        cells,
        failed_runs,
        interrupted: m.interrupted,
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

/// The matrix as it ran: every run and every round's probe.
#[derive(Default)]
struct Matrix {
    results: Vec<RunResult>,
    probes: Vec<RoundProbe>,
    baseline_text: Option<Vec<u8>>,
    /// The signal that stopped it early, if any.
    interrupted: Option<i32>,
    /// What `--until-stable` concluded (None without it).
    stability: Option<String>,
}

/// Run the rounds (a probe step, then every cell in order), with
/// `--until-stable` adding rounds until the paired ratios are narrow enough,
/// then the baseline once more in a round of its own; stops early on a signal.
fn run_matrix(env: &BenchEnv, balloon: Option<&Balloon>) -> Result<Matrix, BenchError> {
    let plan = env.plan;
    let rounds = plan.max_rounds();
    let mut m = Matrix::default();
    let mut last = 0;
    for round in 1..=rounds {
        last = round;
        if !run_round(env, &mut m, round, plan.cells.len(), balloon)? {
            return Ok(m);
        }
        if let Some(s) = plan.until_stable {
            if round >= plan.repeats.max(2) && stable_note(plan, &m, s, round, false).is_some() {
                break;
            }
        }
    }
    if let Some(s) = plan.until_stable {
        m.stability = stable_note(plan, &m, s, last, true);
        crate::say!(
            "bench: --until-stable: {}",
            m.stability.as_deref().unwrap_or("")
        );
    }
    run_round(env, &mut m, last + 1, 1, balloon)?;
    Ok(m)
}

/// With `--until-stable`: the note when every cell's paired ratio has an
/// interval narrower than asked (or, when `at_end`, whatever the state).
fn stable_note(
    plan: &BenchPlan,
    m: &Matrix,
    s: UntilStable,
    rounds: u32,
    at_end: bool,
) -> Option<String> {
    let wide: Vec<String> = (1..plan.cells.len())
        .filter_map(|ci| {
            let w = super::summary::cell_ratio(&m.results, ci, false).and_then(|r| r.width());
            (!w.is_some_and(|w| w < s.width)).then(|| {
                let w = w.map_or_else(|| "none".to_string(), |w| format!("{w:.3}"));
                format!("{} ({w})", plan.cells[ci].name)
            })
        })
        .collect();
    if wide.is_empty() {
        return Some(format!(
            "every cell's ratio to the baseline had a 95% interval narrower than {} (relative) \
             after {rounds} rounds",
            s.width
        ));
    }
    at_end.then(|| {
        format!(
            "LIMIT HIT: {rounds} rounds (--max-repeats) and still as wide as {} (relative) \
             or wider: {}",
            s.width,
            wide.join(", ")
        )
    })
}

/// The order of a round's cells: forward in odd rounds, backward in even
/// ones (A B C, C B A). A cell that reads what the cell before it just read
/// finds it in any cache below the guest (a virtual disk's host), so a fixed
/// order would favour the second of every pair of neighbours; alternating
/// puts each of them second in half the rounds. Round 1 is forward, so the
/// baseline's first run (whose text every other run is compared with) comes
/// first.
pub fn round_order(round: u32, n_cells: usize) -> Vec<usize> {
    match round % 2 {
        0 => (0..n_cells).rev().collect(),
        _ => (0..n_cells).collect(),
    }
}

/// One round: its probe step, then cells `0..n_cells` in [`round_order`];
/// false when a signal stopped it.
fn run_round(
    env: &BenchEnv,
    m: &mut Matrix,
    round: u32,
    n_cells: usize,
    balloon: Option<&Balloon>,
) -> Result<bool, BenchError> {
    match probe_round(env, round, m.probes.last()) {
        Ok(p) => {
            crate::say!("bench: round {round} probe: {}", probe_line(&p));
            m.probes.push(p);
        }
        Err(BenchError::Interrupted(sig)) => {
            m.interrupted = Some(sig);
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    for ci in round_order(round, n_cells) {
        if let Some(sig) = crate::interrupt::requested() {
            m.interrupted = Some(sig);
            return Ok(false);
        }
        check_balloon(balloon)?;
        let k = m.results.len() + 1;
        let neighbour = env.plan.busy_neighbour_runs.contains(&k);
        let cell = &env.plan.cells[ci];
        let stem = env.runs_dir.join(format!("{}-{round}", cell.name));
        let (r, line) = run_cell(env, ci, round, &stem, neighbour, &mut m.baseline_text)?;
        crate::say!(
            "bench: [{k}] round {round} {}: {line} ({:.1} s){}",
            cell.name,
            r.wall_s,
            if neighbour { " [busy neighbour]" } else { "" }
        );
        m.results.push(r);
    }
    Ok(true)
}

/// A probe step's progress line.
fn probe_line(p: &RoundProbe) -> String {
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

/// Fail when the balloon no longer holds its memory (paged out to swap): the
/// remaining runs would not be under the limit.
fn check_balloon(balloon: Option<&Balloon>) -> Result<(), BenchError> {
    if balloon.is_some_and(|b| !b.still_held()) {
        return Err(BenchError::Balloon(format!(
            "less than {:.0}% of the balloon is still in memory (paged out to swap?); \
             the remaining runs would not be under the asked memory limit",
            balloon::HELD_SHARE * 100.0
        )));
    }
    Ok(())
}

/// Flag every run whose conditions differ from its reference beyond the
/// thresholds in [`host`]: a cell's reference is its round's baseline run;
/// the baseline's runs, a cell whose round's baseline run is itself flagged,
/// and the probe steps are held against the quietest baseline run.
fn flag_conditions(results: &mut [RunResult], probes: &mut [RoundProbe]) {
    let base: Vec<host::Conditions> = results
        .iter()
        .filter(|r| r.cell == 0)
        .filter_map(|r| r.conditions)
        .collect();
    let Some(quiet) = host::quietest(&base) else {
        return;
    };
    for r in results.iter_mut().filter(|r| r.cell == 0) {
        if let Some(c) = r.conditions {
            r.flags = host::flags(&c, &quiet);
        }
    }
    for p in probes.iter_mut() {
        p.flags.extend(host::flags(&p.conditions, &quiet));
    }
    let references: Vec<(u32, host::Conditions)> = results
        .iter()
        .filter(|b| b.cell == 0 && b.flags.is_empty())
        .filter_map(|b| Some((b.run, b.conditions?)))
        .collect();
    for r in results.iter_mut().filter(|r| r.cell != 0) {
        let reference = references
            .iter()
            .find(|b| b.0 == r.run)
            .map_or(quiet, |b| b.1);
        if let Some(c) = r.conditions {
            r.flags = host::flags(&c, &reference);
        }
    }
    flag_device_speed(results);
}

/// Flag the runs whose device answered at a speed off their cell's median
/// (the same cell reads the same slices: a different speed is the device's).
/// Not against the round's other cells: cells of one cache size miss on the
/// same slices, but their time per read moves with how they queue (cache 0 in
/// one round: serial 3.3 ms, overlap with prediction 1.5 ms); a cell slow in
/// every run of a bench is for the comparison of two benches to show.
fn flag_device_speed(results: &mut [RunResult]) {
    let flags: Vec<Option<String>> = results
        .iter()
        .map(|r| {
            let cell: Vec<host::Conditions> = results
                .iter()
                .filter(|x| x.cell == r.cell)
                .filter_map(|x| x.conditions)
                .collect();
            host::device_flag(&r.conditions?, &cell)
        })
        .collect();
    for (r, f) in results.iter_mut().zip(flags) {
        r.flags.extend(f);
    }
}

/// Run one (cell, round) and judge it: the failure (if any), the CSV, whether
/// its text equals the baseline's, the host's conditions while it ran; returns
/// it with its progress line. With `neighbour`, a busy neighbour thread runs
/// beside it (its CPU time taken out of the bench's own, so it counts as
/// another's).
fn run_cell(
    env: &BenchEnv,
    ci: usize,
    run: u32,
    stem: &Path,
    neighbour: bool,
    baseline_text: &mut Option<Vec<u8>>,
) -> Result<(RunResult, String), BenchError> {
    let plan = env.plan;
    let busy = match neighbour {
        true => Some(Neighbour::start()?),
        false => None,
    };
    let sample = || {
        let s = host::sample(env.device);
        match &busy {
            Some(n) => n.not_own(s),
            None => s,
        }
    };
    let before = sample();
    let args = &plan.cells[ci].args;
    let (res, speeds) =
        host::with_speed_samples(|| run_child(plan, args, &env.prompt_path, plan.tokens, stem));
    let (mut failure, wall_s) = res?;
    let after = sample();
    drop(busy);
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
        conditions: Some(speeds.onto(host::conditions(&before, &after))),
        flags: Vec::new(),
        probe_set: env.probe.cell_sets.get(ci).copied().unwrap_or(0),
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
    fn rounds_alternate_their_order_and_the_first_is_forward() {
        use super::round_order;
        assert_eq!(round_order(1, 3), vec![0, 1, 2]);
        assert_eq!(round_order(2, 3), vec![2, 1, 0]);
        assert_eq!(round_order(3, 3), vec![0, 1, 2]);
        // The baseline's own last round.
        assert_eq!(round_order(4, 1), vec![0]);
        // Each neighbour goes second in half of any even number of rounds.
        let (mut a_first, mut b_first) = (0, 0);
        for r in 1..=4 {
            let o = round_order(r, 4);
            let pos = |c| o.iter().position(|&x| x == c).unwrap();
            if pos(1) < pos(2) {
                a_first += 1
            } else {
                b_first += 1
            }
        }
        assert_eq!((a_first, b_first), (2, 2));
    }

    #[test]
    fn utc_now_is_a_plausible_timestamp() {
        let s = super::utc_now();
        assert_eq!(s.len(), "2026-11-30 07:00:00 UTC".len(), "{s}");
        assert!(s.starts_with("20"), "{s}");
        assert!(s.ends_with(" UTC"));
    }
}
