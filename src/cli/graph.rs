//! `--n-expert-used K` above the file's own K: tried in a child process
//! (`bmoe check-graph`) before the run, since llama.cpp aborts the process
//! when its graph cannot hold K experts per token.

use std::path::Path;
use std::process::{Command, Stdio};

use bmoe::layout::MoeLayout;

use super::usage::UsageError;

/// What one child said about K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fits {
    Yes,
    /// llama.cpp aborted (or the child died another way) building the graph.
    No,
    /// The child failed with an ordinary error: the run will report it.
    Unknown,
}

fn try_k(exe: &Path, model: &Path, k: u32, n_ctx: u32) -> std::io::Result<Fits> {
    let out = Command::new(exe)
        .arg("check-graph")
        .arg("-m")
        .arg(model)
        .args(["--n-expert-used", &k.to_string(), "-c", &n_ctx.to_string()])
        // An expected abort: no gdb backtrace (ggml attaches one when it can).
        .env("GGML_NO_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    Ok(match out.code() {
        Some(0) => Fits::Yes,
        Some(_) => Fits::Unknown,
        None => Fits::No, // killed by a signal: SIGABRT from GGML_ASSERT
    })
}

/// For the child: an expected abort leaves no core file behind.
pub fn no_core_dumps() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct it is given, valid for the call.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

/// Refuse `k` when llama.cpp cannot build the model's graph with it, naming
/// the largest K that fits. A K at or below the file's own is never tried.
pub fn check_experts_used(model: &Path, k: u32, n_ctx: u32) -> anyhow::Result<()> {
    let Ok(layout) = MoeLayout::open(model) else {
        return Ok(()); // the run reports what is wrong with the file
    };
    if k <= layout.n_expert_used || k > layout.n_expert {
        return Ok(()); // the engine checks the range
    }
    let exe = std::env::current_exe()?;
    if try_k(&exe, model, k, n_ctx)? != Fits::No {
        return Ok(());
    }
    // The largest K that fits, between the file's own and the refused one.
    let (mut lo, mut hi) = (layout.n_expert_used, k);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match try_k(&exe, model, mid, n_ctx)? {
            Fits::Yes => lo = mid,
            _ => hi = mid,
        }
    }
    Err(UsageError(format!(
        "--n-expert-used {k}: llama.cpp cannot build this model's graph with {k} experts per \
         token (its graph arena is sized by the tensor count, and building it would abort); \
         choose at most {lo} (the file routes {})",
        layout.n_expert_used
    ))
    .into())
}
