//! `bmoe trace import INPUT -o OUT`: another tool's routing log (JSONL, a
//! routed-experts array, a CSV) as a route trace for `bmoe replay`, sized
//! like a gguf (`--like`) or with one expert size (`--slot-bytes`).

use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Subcommand};

use bmoe::layout::MoeLayout;
use bmoe_output::PendingFile;
use bmoe_trace::route_trace::{TraceWriter, MAX_EXPERTS};
use bmoe_trace::trace_import::{self, ImportFormat, Imported, Sizes};

use super::usage::{self, UsageError};

#[derive(Debug, Subcommand)]
pub enum TraceCmd {
    /// Turn a routing log of another tool into a route trace for `bmoe
    /// replay`: per-token JSONL, a routed-experts array `[tokens][layers][k]`
    /// (JSON or .npy) or a `layer,expert` CSV. See docs/cache.md.
    Import(ImportArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("sizes").required(true).args(["like", "slot_bytes"])))]
pub struct ImportArgs {
    /// The routing log.
    pub input: PathBuf,
    /// auto (from the first bytes), jsonl, array (JSON or .npy) or csv.
    #[arg(long, value_name = "FORMAT", default_value = "auto")]
    pub format: ImportFormat,
    /// The model the log was routed by: its experts and each layer's
    /// expert size, as `bmoe run --route-trace` records them.
    #[arg(long, value_name = "MODEL.gguf")]
    pub like: Option<PathBuf>,
    /// Without a gguf: the bytes of one expert, the same for every layer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub slot_bytes: Option<u64>,
    /// Without a gguf: experts per layer (default: the largest id + 1).
    #[arg(long, value_name = "N", conflicts_with = "like",
          value_parser = clap::value_parser!(u32).range(1..=MAX_EXPERTS as i64))]
    pub experts: Option<u32>,
    /// The route trace to write (beside it, then renamed over it).
    #[arg(short, long, value_name = "OUT.bmrt")]
    pub out: PathBuf,
}

/// Run a `trace` subcommand.
pub fn trace_cmd(cmd: TraceCmd) -> Result<()> {
    match cmd {
        TraceCmd::Import(a) => import(a),
    }
}

/// Read, convert, write, and say what was found.
fn import(a: ImportArgs) -> Result<()> {
    let usage = |p: &Path, e: String| UsageError(format!("{}: {e}", p.display()));
    let inputs: Vec<&Path> = std::iter::once(&a.input)
        .chain(&a.like)
        .map(|p| p.as_path())
        .collect();
    usage::output_file("-o", &a.out, &inputs)?;
    let input =
        bmoe::user_file::read_regular(&a.input).map_err(|e| usage(&a.input, e.to_string()))?;
    let sizes = sizes(&a)?;
    let imported = trace_import::import(&input, a.format, sizes)
        .map_err(|e| usage(&a.input, e.to_string()))?;
    write(&a.out, &imported).map_err(|e| usage(&a.out, e.to_string()))?;
    outln!("{}", imported.summary);
    for n in &imported.summary.notes {
        outln!("note: {n}");
    }
    outln!(
        "wrote {} ({} records); replay it with bmoe replay {}",
        a.out.display(),
        imported.records.len(),
        a.out.display()
    );
    Ok(())
}

/// The expert sizes: the gguf's (with its file name) or the flat ones.
fn sizes(a: &ImportArgs) -> Result<Sizes> {
    let Some(model) = &a.like else {
        let name = a
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(Sizes::Flat {
            slot_bytes: a.slot_bytes.unwrap_or(0),
            n_expert: a.experts,
            name,
        });
    };
    let layout = MoeLayout::open(model)
        .map_err(|e| UsageError(format!("--like {}: {e}", model.display())))?;
    if !layout.is_moe() {
        return Err(UsageError(format!(
            "--like {}: not a Mixture-of-Experts model (no expert tensors)",
            model.display()
        ))
        .into());
    }
    let header = bmoe::stream::route_trace_header(model, &layout, layout.n_expert_used);
    Ok(Sizes::Like(header))
}

/// The trace, written beside `out` and moved into place when whole.
fn write(out: &Path, t: &Imported) -> Result<(), String> {
    let (file, pending) = PendingFile::create(out).map_err(|e| e.to_string())?;
    let mut w =
        TraceWriter::new(BufWriter::new(file), t.header.clone()).map_err(|e| e.to_string())?;
    for r in &t.records {
        w.record(r).map_err(|e| e.to_string())?;
    }
    w.into_inner()
        .into_inner()
        .map_err(|e| e.error().to_string())?
        .sync_all()
        .map_err(|e| e.to_string())?;
    pending.commit().map_err(|e| e.to_string())
}
