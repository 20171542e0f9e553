//! Writing a finished bench's `summary.md`: the header facts (command, model,
//! host, balloon), then the bound, cells, memory and runs tables and the
//! cells' flags.

use std::fmt::Write as _;

use super::host;
use super::plan::BenchPlan;
use super::tables::{flags_cell, probes_table, ratios_table};
use super::{
    bound::RoundProbe, cells::Cell, summary::CellSummary, summary::RunResult, tables::cells_table,
    tables::legend,
};
use crate::lab::compare::{self, RunCsv};
use crate::layout::MoeLayout;

const MIB: f64 = 1024.0 * 1024.0;

/// Everything `summary.md` is written from.
pub(super) struct SummaryInputs<'a> {
    pub(crate) plan: &'a BenchPlan,
    pub(crate) layout: &'a MoeLayout,
    /// Every round's probe step.
    pub(crate) probes: &'a [RoundProbe],
    /// What each probe set reads (the sets of the probe table's columns).
    pub(crate) probe_sets: &'a [super::traced::ProbeSlices],
    pub(crate) cells: &'a [CellSummary],
    pub(crate) results: &'a [RunResult],
    /// When the bench started (`utc_now`).
    pub(crate) started: &'a str,
    /// MemAvailable before the probe, in bytes.
    pub(crate) avail0: Option<u64>,
    pub(crate) balloon_note: &'a str,
    /// Whether the balloon still held its memory after the matrix (None: no balloon).
    pub(crate) balloon_held_at_end: Option<bool>,
    pub(crate) interrupted: Option<i32>,
    /// What `--until-stable` concluded (None without it).
    pub(crate) stability: Option<&'a str>,
}

/// The whole `summary.md` text.
pub(super) fn summary_md(s: &SummaryInputs) -> String {
    let plan = s.plan;
    let mut md = String::new();
    write_header(&mut md, s);
    let _ = writeln!(md, "\n## Physical bound, probed in every round\n");
    md.push_str(&probes_table(
        s.probes,
        s.probe_sets,
        s.layout.slice_bytes(crate::layout::Proj::Gate).unwrap_or(0),
    ));
    let _ = writeln!(md, "\n## Cells\n");
    md.push_str(&cells_table(s.cells));
    let _ = writeln!(
        md,
        "\ntok/s: decode rate over the single-token decodes, mean of the cell's runs; \
         95% CI: two-level percentile bootstrap ({} draws, fixed seed) that resamples the \
         cell's runs, then the per-token times within each (with one run it covers only the \
         token-to-token noise; from two runs on, also the drift between runs); bound: \
         min(resident rate, read bandwidth of the probe set of the cell's cache size (the slices \
         it misses on) at its queue depth / its bytes per token), \
         from the probe of each run's own round, mean over the runs; of bound: mean over the \
         runs of tok/s over that bound (in the ratios table below, \"N of M above the probe\" \
         counts runs faster than their bound: their round's probe measured less than the run \
         itself did, so it is no ceiling for that cell); x baseline: ratio of means to the first cell; \
         text = baseline: the generated text equals the baseline's first run byte for byte.",
        compare::BOOTSTRAP_RESAMPLES
    );
    let _ = writeln!(
        md,
        "\n## Ratios over all runs and over the unflagged ones\n"
    );
    md.push_str(&ratios_table(&plan.cells, s.results, s.probes));
    let _ = writeln!(
        md,
        "\nx baseline: geometric mean over the rounds of the cell's run over the baseline's \
         run of the same round (paired, so drift between rounds cancels); 95% CI: Student's t \
         over the rounds' log ratios (none with one round). Unflagged: rounds in which neither \
         run was flagged; of bound, unflagged: runs not flagged whose round's probe was not \
         flagged. {}",
        flag_rule()
    );
    let _ = writeln!(md, "\n## End-to-end rate\n");
    md.push_str(&super::end_to_end::end_to_end_table(&plan.cells, s.results));
    let _ = writeln!(
        md,
        "\nend-to-end tok/s: each run's `decode_tok_s` (tokens after the first over the wall \
         time from the first to the last: decodes, drafting, sampling, output and telemetry; \
         what a user sees), per run in round order; outside decodes: the share of that time \
         spent between the decodes (1 − end-to-end over the decodes-alone rate of the cells \
         table; a speculating cell's drafting and catch-up are in it); x baseline: paired by \
         round as above, over all runs. Compare speculating cells on this table."
    );
    let _ = writeln!(md, "\n## Memory\n");
    md.push_str(&memory_table(s.results, &plan.cells, s.layout));
    let _ = writeln!(md, "\n## Runs, in the order they ran\n");
    md.push_str(&runs_table(s.results, plan));
    let _ = writeln!(md, "\n## Cells' flags\n");
    md.push_str(&legend(s.results, &plan.cells));
    md
}

/// The title and the bullet list of facts about the bench and the host.
fn write_header(md: &mut String, s: &SummaryInputs) {
    let (plan, started, balloon_note) = (s.plan, s.started, s.balloon_note);
    let _ = writeln!(md, "# bmoe bench\n");
    let _ = writeln!(md, "- command: `{}`", plan.command_line);
    let _ = writeln!(md, "- started: {started}, finished: {}", utc_now());
    let _ = writeln!(md, "- bmoe: {}", crate::VERSION);
    let _ = writeln!(md, "- model: `{}`", plan.model.display());
    let _ = writeln!(
        md,
        "- workload: {} ({} bytes of prompt), {} tokens per run",
        plan.workload.name,
        plan.workload.prompt.len(),
        plan.workload.tokens
    );
    let _ = writeln!(
        md,
        "- cells: {} ({}), {} round(s) interleaved, baseline `{}` run {} times",
        plan.cells.len(),
        plan.cells_source,
        full_rounds(s.results, plan.cells.len()),
        plan.cells.first().map(|c| c.name.as_str()).unwrap_or("-"),
        s.results.iter().filter(|r| r.cell == 0).count()
    );
    let _ = writeln!(
        md,
        "- host: {} cores, MemTotal {:.0} MiB, MemAvailable at start {:.0} MiB",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        mem_total_bytes().unwrap_or(0) as f64 / MIB,
        s.avail0.unwrap_or(0) as f64 / MIB
    );
    let _ = writeln!(md, "- balloon: {balloon_note}");
    if s.balloon_held_at_end == Some(false) {
        let _ = writeln!(
            md,
            "- WARNING: the balloon was no longer all in memory at the end of the matrix \
             (paged out to swap?)"
        );
    }
    if let Some(note) = s.stability {
        let _ = writeln!(md, "- --until-stable: {note}");
    }
    let _ = writeln!(md, "- {}", overhead_line(s.probes, s.results));
    if let Some(sig) = s.interrupted {
        let _ = writeln!(
            md,
            "- INTERRUPTED by signal {sig} after {} runs",
            s.results.len()
        );
    }
}

/// Rounds in which every cell ran: the last cell's runs (a lone baseline's,
/// less its extra run).
fn full_rounds(results: &[RunResult], n_cells: usize) -> usize {
    let last = n_cells.saturating_sub(1);
    let runs = results.iter().filter(|r| r.cell == last).count();
    if last == 0 {
        runs.saturating_sub(1)
    } else {
        runs
    }
}

/// What the probe steps cost against the cells' runs.
fn overhead_line(probes: &[RoundProbe], results: &[RunResult]) -> String {
    let probe_s: f64 = probes.iter().map(|p| p.wall_s).sum();
    let runs_s: f64 = results.iter().map(|r| r.wall_s).sum();
    let per_probe = probe_s / probes.len().max(1) as f64;
    let per_run = runs_s / results.len().max(1) as f64;
    format!(
        "bench overhead: {} probe steps took {probe_s:.0} s ({per_probe:.1} s each, {:.0}% of \
         the {runs_s:.0} s of runs; a run took {per_run:.1} s on average)",
        probes.len(),
        if runs_s > 0.0 {
            probe_s * 100.0 / runs_s
        } else {
            0.0
        }
    )
}

/// How runs are flagged, with the thresholds.
fn flag_rule() -> String {
    format!(
        "A run is flagged when, against its reference (its round's baseline run; for the \
         baseline's runs, a cell whose round's baseline run is flagged, and the probe steps: \
         the quietest baseline run), other processes took more than {} cores more CPU, steal \
         was more than {} cores higher, other readers read more than {} MiB/s more from the \
         model's device, MemAvailable at its start differed by more than {:.0}% of MemTotal, \
         or a single-threaded CPU kernel timed every 250 ms while it ran (the median is the CPU \
         kernel ms column; the reference is the baseline runs' median) was more than {}x slower \
         or faster, or writing 1 MiB of fresh anonymous memory, timed the same way (the fresh \
         page us column: how fast the host backs the guest's new pages, which a cell filling a \
         large cache pays for every slot), was more than {}x slower or faster; \
         or when the device's mean time per read was more than {}x off (either way) the median \
         of the same cell's runs (a run with at least {} reads, a cell with at least three: the \
         same cell reads the same slices, so a different speed is the device's).",
        host::OTHER_CPU_CORES_LIMIT,
        host::STEAL_CORES_LIMIT,
        host::OTHER_READ_MIB_S_LIMIT,
        host::MEM_AVAILABLE_SHARE_LIMIT * 100.0,
        host::CPU_KERNEL_FACTOR_LIMIT,
        host::FRESH_PAGE_FACTOR_LIMIT,
        host::DEVICE_MS_FACTOR_LIMIT,
        host::DEVICE_MIN_READS
    )
}

/// MemTotal of `/proc/meminfo`, in bytes.
fn mem_total_bytes() -> Option<u64> {
    crate::stream::memory::meminfo_bytes("MemTotal")
}

/// One row per run, in the order they ran: rate, traffic, the host's
/// conditions, wall time, CSV, status and flags.
fn runs_table(results: &[RunResult], plan: &BenchPlan) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| # | cell | round | tok/s | MiB/token | other CPU cores | steal cores | disk busy % | \
         device ms/read | other reads MiB/s | MemAvailable MiB | page cache MiB | CPU kernel ms | \
         fresh page us | sys CPU s | minor faults | wall s | csv | status | flags |"
    );
    let _ = writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
    );
    for (i, r) in results.iter().enumerate() {
        let f = r.csv.as_ref().map(compare::figures);
        let (rate, mib) = match (&r.failure, f) {
            (None, Some(Ok(f))) => (
                format!("{:.2}", f.rate.tok_s),
                format!("{:.2}", f.mib_per_token),
            ),
            _ => ("—".into(), "—".into()),
        };
        let rel = r
            .csv_path
            .strip_prefix(&plan.out_dir)
            .unwrap_or(&r.csv_path)
            .display()
            .to_string();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {rate} | {mib} | {} | {:.1} | {rel} | {} | {} |",
            i + 1,
            plan.cells[r.cell].name,
            r.run,
            conditions_cells(r.conditions.as_ref()),
            r.wall_s,
            r.failure.as_deref().unwrap_or("ok").replace('|', "/"),
            flags_cell(&r.flags)
        );
    }
    md
}

/// The conditions columns of a runs-table row.
fn conditions_cells(c: Option<&host::Conditions>) -> String {
    let Some(c) = c else {
        return "— | — | — | — | — | — | — | — | — | — | —".into();
    };
    let opt =
        |v: Option<f64>, scale: f64| v.map_or_else(|| "—".into(), |x| format!("{:.0}", x * scale));
    format!(
        "{:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {}",
        c.other_cpu_cores,
        c.steal_cores,
        opt(c.disk_busy_share, 100.0),
        c.read_ms.map_or_else(|| "—".into(), |x| format!("{x:.2}")),
        opt(c.other_read_mib_s, 1.0),
        opt(c.mem_available_mib, 1.0),
        opt(c.cached_mib, 1.0),
        c.cpu_kernel_ms
            .map_or_else(|| "—".into(), |x| format!("{x:.2}")),
        c.fresh_page_us
            .map_or_else(|| "—".into(), |x| format!("{x:.2}")),
        c.own_sys_s,
        c.own_minor_faults
    )
}

/// Peak RSS of each streamed cell against the budget formula: dense weights
/// + cache budget + the 512 MiB headroom `--cache-mb` keeps for llama.cpp's
///   buffers and the process.
fn memory_table(results: &[RunResult], cells: &[Cell], layout: &MoeLayout) -> String {
    let mut out = String::new();
    let dense_mib = layout.dense_bytes() as f64 / MIB;
    let headroom_mib = crate::stream::HEADROOM_BYTES as f64 / MIB;
    let _ = writeln!(
        out,
        "| cell | mode | cache MiB | peak RSS MiB (max over runs) | budget MiB (dense {dense_mib:.0} + cache + {headroom_mib:.0}) | within |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---|");
    for (ci, c) in cells.iter().enumerate() {
        let runs: Vec<&RunCsv> = results
            .iter()
            .filter(|r| r.cell == ci && r.failure.is_none())
            .filter_map(|r| r.csv.as_ref())
            .collect();
        let Some(first) = runs.first() else { continue };
        let mode = first.preamble.get("mode").cloned().unwrap_or_default();
        let cache: f64 = first
            .preamble
            .get("cache_mb")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let rss = runs
            .iter()
            .filter_map(|r| r.trailer.get("peak_rss_bytes"))
            .filter_map(|v| v.parse::<f64>().ok())
            .fold(0.0f64, f64::max)
            / MIB;
        if mode == "stream" {
            let budget = dense_mib + cache + headroom_mib;
            let _ = writeln!(
                out,
                "| {} | stream | {cache:.0} | {rss:.0} | {budget:.0} | {} |",
                c.name,
                if rss <= budget { "yes" } else { "NO" }
            );
        } else {
            let _ = writeln!(
                out,
                "| {} | {mode} (mmap: RSS counts mapped file pages) | — | {rss:.0} | — | — |",
                c.name
            );
        }
    }
    out
}

/// UTC date and time of now, `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc_now() -> String {
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
