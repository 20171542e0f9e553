//! `--route-trace FILE`: the file the verify hook records its demands in,
//! written under a temporary name beside FILE and moved into place when the
//! run ends (a run that fails leaves FILE as it was).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use bmoe_output::PendingFile;
use bmoe_trace::route_trace::{TraceHeader, TraceWriter};

use super::error::StreamError;
use crate::layout::MoeLayout;

/// The writer the verify hook owns.
pub(crate) type RouteTraceWriter = TraceWriter<BufWriter<File>>;

/// Buffered bytes before a write to the file (the hook flushes at the end
/// of every decode anyway; a prompt's decode can log far more).
const BUFFER_BYTES: usize = 1 << 20;

/// The model as a replay needs it: each layer's slot bytes (the flash actor's
/// layers: up to the last one with experts), experts, k and identity.
/// `bmoe trace import --like` sizes an imported trace with it too.
pub fn header(model: &Path, layout: &MoeLayout, k: u32) -> TraceHeader {
    let mut slot_bytes: Vec<u64> = (0..layout.n_layer + layout.n_layer_nextn)
        .map(|l| layout.layer_expert_bytes(l))
        .collect();
    while slot_bytes.last() == Some(&0) {
        slot_bytes.pop();
    }
    TraceHeader {
        n_expert: layout.n_expert,
        k,
        trunk_layers: layout.n_layer,
        slot_bytes,
        model_bytes: layout.file_bytes,
        model_name: model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// Create the trace's temporary file and write its header.
pub(crate) fn create(
    path: &Path,
    header: TraceHeader,
) -> Result<(RouteTraceWriter, PendingFile), StreamError> {
    let io = |source| StreamError::Io {
        what: format!("--route-trace {}", path.display()),
        source,
    };
    let (file, pending) = PendingFile::create(path).map_err(io)?;
    let out = BufWriter::with_capacity(BUFFER_BYTES, file);
    let writer = TraceWriter::new(out, header).map_err(|e| StreamError::RouteTrace {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((writer, pending))
}

/// Move the finished trace into place; returns where it is.
pub(crate) fn commit(pending: PendingFile) -> Result<PathBuf, StreamError> {
    let target = pending.target().to_path_buf();
    pending.commit().map_err(|source| StreamError::Io {
        what: format!("--route-trace {}: moving it into place", target.display()),
        source,
    })?;
    Ok(target)
}
