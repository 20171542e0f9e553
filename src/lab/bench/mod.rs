//! `bmoe bench`: a matrix of `bmoe run` configurations on one model and one
//! prompt, interleaved in rounds (ABAB), the baseline run once more than the
//! others to show the noise band, each run's CSV kept, and a `summary.md` that
//! puts the cells side by side with a bootstrap interval, the ratio to the
//! baseline paired by round, and the ratio to the host's physical bound (the
//! read probe and resident rate `bmoe probe` measures, measured again in every
//! round); each run's host conditions are recorded and disturbed runs flagged.
//!
//! This module is the plan and the arithmetic (cells, presets, bound, host
//! conditions, ratios, summary); [`runner`] spawns the runs, [`balloon`]
//! emulates a smaller host and [`neighbour`] a busy one.

pub mod balloon;
mod bound;
mod cells;
mod child;
mod end_to_end;
pub mod host;
pub mod neighbour;
mod ratio;
mod report;
pub mod runner;
mod summary;
mod traced;
mod workload;

use std::path::PathBuf;

use crate::lab::compare;

pub use bound::{Bound, RoundProbe};
pub use cells::{cell_depths, parse_cells, preset, split_args, Cell, PRESETS};
pub use summary::{cells_table, legend, summarize, CellSummary, RunResult};
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
