//! `bmoe bench`: a matrix of `bmoe run` configurations on one model and one
//! prompt, interleaved in rounds (ABAB), the baseline run once more than the
//! others to show the noise band, each run's CSV kept, and a `summary.md` that
//! puts the cells side by side with a bootstrap interval, the ratio to the
//! baseline paired by round, and the ratio to the host's physical bound (the
//! read probe and resident rate `bmoe probe` measures, measured again in every
//! round); each run's host conditions are recorded and disturbed runs flagged.
//!
//! The plan and the arithmetic: cells and presets (`cells`), the plan
//! (`plan`), the bound (`bound`), host conditions and their flags (`host`,
//! `judge`), paired ratios (`ratio`), the pooled figures and tables
//! (`summary`, `tables`, `report`). The running: `runner` (the whole bench),
//! `rounds` (the matrix), `probe` (each round's probe step), `cell_run` (one
//! run), `child` (the `bmoe run` processes), `traced` (what the probe reads);
//! [`balloon`] emulates a smaller host and `neighbour` a busy one.

pub mod balloon;
mod bound;
mod cell_run;
mod cells;
mod child;
mod end_to_end;
mod host;
mod judge;
mod neighbour;
mod plan;
mod probe;
mod ratio;
mod report;
mod rounds;
mod runner;
mod summary;
mod tables;
mod traced;
mod workload;

use std::path::{Path, PathBuf};

use crate::lab::compare;

pub(crate) use bound::{Bound, RoundProbe};
pub use cells::{
    cell_depths, parse_cells, preset, split_args, Cell, CellSettings, Settle, PRESETS,
};
pub use plan::{BenchOutcome, BenchPlan, ProbeSettings, UntilStable, Workload};
pub use runner::{run_bench, FILES_IN_OUT_DIR};
pub(crate) use summary::{summarize, CellSummary, RunResult};
pub use tables::{cells_table, legend};
pub use workload::{warm_page_cache, workload, WORKLOADS};

/// Errors of planning, running or summarizing a bench.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{source_name}:{line}: {msg}")]
    Cells {
        source_name: String,
        line: usize,
        msg: String,
    },
    #[error("unknown preset {name:?}; presets: {known}")]
    Preset { name: String, known: String },
    #[error("unknown workload {name:?}: give one of {known} or a prompt file that exists")]
    Workload { name: String, known: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("balloon: {0}")]
    Balloon(String),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Compare(#[from] compare::CompareError),
    #[error("stopped by signal {0} while measuring the bound")]
    Interrupted(i32),
}

pub(super) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::Io { what, path, source }
}
