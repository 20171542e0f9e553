//! `bmoe bench` and `bmoe probe`: the commands that measure around a run.

use std::path::Path;

use anyhow::{Context as _, Result};
use clap::Parser as _;

use bmoe::engine::{self, Asked, RunConfig};
use bmoe::layout::MoeLayout;

use super::args::{BenchArgs, Cli, Command, ProbeArgs};
use super::checks;
use super::model::model_or_default;
use super::usage::UsageError;

/// `bmoe bench`: check the cells and flags, run the matrix, print the cells
/// table and say where the summary is.
pub fn bench(args: BenchArgs) -> Result<()> {
    use bmoe::lab::bench;
    let (cells, cells_source) = bench_cells(&args)?;
    if let Some(trace) = &args.route_from {
        check_route_from(&cells, trace)?;
    }
    checks::bench_out_dir(&args.out)?;
    for written in bmoe::lab::bench::FILES_IN_OUT_DIR {
        checks::output_file("-o", &args.out.join(written), &checks::bench_inputs(&args))?;
    }
    if !(args.probe_seconds > 0.0 && args.probe_seconds.is_finite()) {
        return Err(UsageError("--probe-seconds must be > 0".into()).into());
    }
    if let Some(w) = args.until_stable {
        if !(w > 0.0 && w.is_finite()) {
            return Err(UsageError(format!(
                "--until-stable {w}: give the widest accepted 95% interval of a ratio, e.g. 0.1"
            ))
            .into());
        }
        if args.max_repeats < args.repeats {
            return Err(UsageError(format!(
                "--max-repeats {} is below --repeats {}: --until-stable runs at least --repeats rounds",
                args.max_repeats, args.repeats
            ))
            .into());
        }
    }
    if args.ram_limit_mb == Some(0) {
        return Err(UsageError("--ram-limit-mb 0 leaves nothing to run in".into()).into());
    }
    let (workload, prompt) =
        bench::workload(&args.workload).map_err(|e| UsageError(e.to_string()))?;
    let model = model_or_default(&args.model)?;
    if !model.is_file() {
        return Err(UsageError(format!(
            "{}: no such model file (build the default one with `bmoe fixture upcycle`)",
            model.display()
        ))
        .into());
    }
    let exe = std::env::current_exe().context("locate the bmoe binary to start the runs")?;
    let depths = probe_depths(&args, &cells);
    let plan = bench::BenchPlan {
        exe,
        model,
        cells,
        cells_source,
        workload: bench::Workload {
            name: workload,
            prompt,
            tokens: args.tokens,
        },
        repeats: args.repeats,
        out_dir: args.out.clone(),
        ram_limit_mib: args.ram_limit_mb,
        probe: bench::ProbeSettings {
            depths,
            seconds: args.probe_seconds,
            resident_tokens: args.tokens,
        },
        run_timeout: std::time::Duration::from_secs(args.run_timeout_s),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        until_stable: args.until_stable.map(|width| bench::UntilStable {
            width,
            max_rounds: args.max_repeats,
        }),
        busy_neighbour_runs: args.busy_neighbour.clone(),
        route_from: args.route_from.clone(),
    };
    let outcome = bench::run_bench(&plan)?;
    bench_outcome(&outcome)
}

/// The probe's queue depths: `--probe-depths`, else the streamed cells'
/// (`--io-threads`, default the run's), else the default depth alone.
fn probe_depths(args: &BenchArgs, cells: &[bmoe::lab::bench::Cell]) -> Vec<u32> {
    let default = bmoe::stream::StreamConfig::default().io_threads;
    let depths = args
        .probe_depths
        .clone()
        .unwrap_or_else(|| bmoe::lab::bench::cell_depths(cells));
    if depths.is_empty() {
        vec![default]
    } else {
        depths
    }
}

/// `bench --route-from TRACE` gives every run `bmoe run --route-from TRACE`
/// (the cells', the traced run's and the resident probe's): each cell's
/// flags checked with it, before anything runs.
fn check_route_from(cells: &[bmoe::lab::bench::Cell], trace: &Path) -> Result<(), UsageError> {
    for c in cells {
        if c.args.iter().any(|a| a == "--route-from") {
            return Err(UsageError(format!(
                "cell {:?} has its own --route-from, and bench --route-from gives every run one: \
                 drop one of them",
                c.name
            )));
        }
        let mut args = c.args.clone();
        args.extend(["--route-from".into(), trace.display().to_string()]);
        settle_cell(&args)
            .map_err(|e| UsageError(format!("cell {:?} with --route-from: {e}", c.name)))?;
    }
    Ok(())
}

/// The cells (from --cells FILE, else a preset, `cache` by default) and
/// where they came from.
fn bench_cells(args: &BenchArgs) -> Result<(Vec<bmoe::lab::bench::Cell>, String)> {
    use bmoe::lab::bench;
    Ok(match (&args.cells, &args.preset) {
        (Some(f), _) => {
            let text = checks::read_text_file("the cells file", f, "")?;
            (
                bench::parse_cells(&f.display().to_string(), &text, &settle_cell)
                    .map_err(|e| UsageError(e.to_string()))?,
                f.display().to_string(),
            )
        }
        (None, p) => {
            let name = p.as_deref().unwrap_or("cache");
            (
                bench::preset(name, &settle_cell).map_err(|e| UsageError(e.to_string()))?,
                format!("preset {name}"),
            )
        }
    })
}

/// `bmoe run`'s own parse and checks of one cell's flags (clap, then the
/// checks clap cannot express), before any run: the settings the lab reads,
/// or the refusal's first line.
fn settle_cell(flags: &[String]) -> Result<bmoe::lab::bench::CellSettings, String> {
    let argv = ["bmoe", "run", "-p", "x"]
        .into_iter()
        .map(String::from)
        .chain(flags.iter().cloned());
    let first_line = |msg: &str| {
        let line = msg.lines().next().unwrap_or("");
        line.trim_start_matches("error: ").to_string()
    };
    match Cli::try_parse_from(argv) {
        Err(e) => Err(first_line(&e.to_string())),
        Ok(Cli {
            command: Command::Run(a),
            ..
        }) => {
            checks::run_args(&a).map_err(|e| first_line(&e.0))?;
            let extras = super::stream::StreamExtras {
                route_trace: a.outputs.route_trace.clone(),
                reserved_bytes: 0,
            };
            let stream = a.streaming.mode(extras).into_stream();
            Ok(bmoe::lab::bench::CellSettings {
                n_ctx: a.model.ctx,
                stream,
            })
        }
        Ok(_) => Err("not a `bmoe run` line".into()),
    }
}

/// Print the cells table and where the summary is; fail when runs failed
/// (an interrupted bench is not a failure here: main() sets the exit code).
fn bench_outcome(outcome: &bmoe::lab::bench::BenchOutcome) -> Result<()> {
    out!("{}", bmoe::lab::bench::cells_table(&outcome.cells));
    bmoe::say!("bench: summary in {}", outcome.summary_path.display());
    if let Some(sig) = outcome.interrupted {
        // main() turns the pending signal into exit code 130/143.
        bmoe::say!("bench: stopped by signal {sig}; the summary covers the runs that finished");
        return Ok(());
    }
    if outcome.failed_runs > 0 {
        anyhow::bail!(
            "{} run(s) failed; their errors are in {} and runs/*.err",
            outcome.failed_runs,
            outcome.summary_path.display()
        );
    }
    Ok(())
}

/// `bmoe probe`: read bandwidth per queue depth on the model's expert slices,
/// then the resident compute rate.
pub fn probe(args: ProbeArgs) -> Result<()> {
    let model = model_or_default(&args.model)?;
    let layout = MoeLayout::open(&model).with_context(|| format!("open {}", model.display()))?;
    if !layout.is_moe() {
        return Err(UsageError(format!(
            "{} has no expert tensors to probe",
            model.display()
        ))
        .into());
    }
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(UsageError("--seconds must be > 0".into()).into());
    }
    if !probe_reads(&args, &layout)? {
        return Ok(());
    }
    if args.resident_tokens > 0 {
        probe_resident(&args, &model)?;
    }
    Ok(())
}

/// The read-bandwidth table, one row per queue depth; false when a signal
/// stopped it.
fn probe_reads(args: &ProbeArgs, layout: &MoeLayout) -> Result<bool> {
    let (file, slices) = bmoe::stream::probe_slices(layout);
    outln!(
        "probe: {} ({} slices of {} bytes), {}",
        file.display(),
        slices.len(),
        layout.slice_bytes(bmoe::layout::Proj::Gate).unwrap_or(0),
        if args.no_odirect {
            "buffered"
        } else {
            "O_DIRECT"
        }
    );
    outln!("{:>6} {:>10} {:>12}", "depth", "MiB/s", "reads/s");
    for &d in &args.depths {
        let r = bmoe_flash::probe_read_bandwidth(
            &file,
            &slices,
            bmoe_flash::ReadSettings {
                queue_depth: d.max(1),
                o_direct: !args.no_odirect,
            },
            std::time::Duration::from_secs_f64(args.seconds),
            bmoe_flash::ProbeOrder::Random { seed: 0x5eed },
            &|| bmoe::interrupt::requested().is_some(),
        )?;
        if bmoe::interrupt::requested().is_some() {
            // main() turns the signal into exit code 130/143; the depth cut
            // short is not reported as a measurement.
            bmoe::say!("probe: stopped by a signal");
            return Ok(false);
        }
        outln!(
            "{:>6} {:>10.1} {:>12.1}",
            d,
            r.bytes_per_s() / (1024.0 * 1024.0),
            r.reads as f64 / r.elapsed.as_secs_f64()
        );
    }
    Ok(true)
}

/// The compute bound: a resident decode (no reads, no memory pressure).
fn probe_resident(args: &ProbeArgs, model: &Path) -> Result<()> {
    let mut cfg = RunConfig::new(
        model.to_path_buf(),
        bmoe::lab::bench::WORKLOADS[0].1.to_string(),
    );
    cfg.job.n_predict = args.resident_tokens.max(2);
    cfg.job.ignore_eos = true;
    cfg.mode = Asked::Resident;
    // With the file in the page cache, so this measures compute, not the disk.
    bmoe::lab::bench::warm_page_cache(model)
        .with_context(|| format!("read {} to warm the page cache", model.display()))?;
    let report = engine::run(&cfg, |_| {}).context("the resident compute-rate run")?;
    outln!(
        "resident compute rate: {:.2} tok/s over {} tokens ({} threads)",
        report.decode_tok_s(),
        report.generation.tokens.len(),
        cfg.threads
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::settle_cell;
    use bmoe::lab::bench::{cell_depths, parse_cells};

    fn cells(text: &str) -> Vec<bmoe::lab::bench::Cell> {
        parse_cells("t", text, &settle_cell).expect("cells")
    }

    #[test]
    fn a_cells_settings_are_bmoe_runs_own_parse() {
        let c = cells("a: --cache-mb 25% --cache-policy lru\nr: --resident\nd: --overlap\n");
        let a = c[0].settings.stream.as_ref().expect("streamed");
        assert_eq!(a.cache, bmoe::stream::CacheSize::Percent(25.0));
        assert_eq!(a.policy, bmoe_flash::cache::CachePolicy::Lru);
        assert_eq!(c[1].settings.stream, None);
        let d = c[2].settings.stream.as_ref().expect("streamed");
        let defaults = bmoe::stream::StreamConfig::default();
        assert_eq!((d.cache, d.policy), (defaults.cache, defaults.policy));
        assert_eq!(c[2].settings.n_ctx, bmoe::engine::DEFAULT_N_CTX);
    }

    /// Every shipped cells file (benches/cells/) is a matrix `bmoe bench
    /// --cells` takes: each line `bmoe run`'s own flags, the names distinct.
    #[test]
    fn every_shipped_cells_file_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/cells");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("benches/cells") {
            let path = e.expect("an entry").path();
            let text = std::fs::read_to_string(&path).expect("a cells file");
            let name = path.display().to_string();
            let c = parse_cells(&name, &text, &settle_cell).unwrap_or_else(|e| panic!("{e}"));
            assert!(c.len() >= 2, "{name}: {} cells", c.len());
            n += 1;
        }
        assert!(n >= 10, "only {n} cells files");
    }

    #[test]
    fn the_probe_depths_are_the_streamed_cells_depths() {
        let c = cells(
            "a: --cache-mb 0\nb: --io-threads 16 --overlap\nc: --io-threads=2\nr: --resident\n",
        );
        let default = bmoe::stream::StreamConfig::default().io_threads;
        let mut want = vec![2, default, 16];
        want.sort_unstable();
        want.dedup();
        assert_eq!(cell_depths(&c), want);
        assert!(cell_depths(&c[3..4]).is_empty());
    }

    #[test]
    fn a_cell_bmoe_run_refuses_is_refused_by_name() {
        let e = parse_cells(
            "f",
            "ok: --overlap\nbad: --resident --overlap\n",
            &settle_cell,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("f:2") && e.contains("cannot be used with"),
            "{e}"
        );
        let e = parse_cells("f", "x: --drop-cold-experts 5\n", &settle_cell)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--drop-cold-experts 5"), "{e}");
    }

    #[test]
    fn bench_route_from_is_checked_with_every_cells_flags() {
        let trace = std::path::Path::new("t.trace");
        let c = cells("a: --cache-mb 0\nr: --resident\n");
        super::check_route_from(&c, trace).expect("forced");
        let c = cells("a: --cache-mb 0\ns: --ngram\n");
        let e = super::check_route_from(&c, trace).unwrap_err().0;
        assert!(e.contains("cell \"s\"") && e.contains("--ngram"), "{e}");
        let c = cells("a: --route-from other.trace\n");
        let e = super::check_route_from(&c, trace).unwrap_err().0;
        assert!(e.contains("its own --route-from"), "{e}");
    }
}
