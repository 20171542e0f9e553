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
mod env;
mod error;
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

pub use cells::{
    cell_depths, parse_cells, preset, split_args, Cell, CellSettings, Settle, PRESETS,
};
pub use error::BenchError;
pub use plan::{BenchOutcome, BenchPlan, ProbeSettings, UntilStable, Workload};
pub use runner::{run_bench, FILES_IN_OUT_DIR};

pub use tables::{cells_table, legend};
pub use workload::{warm_page_cache, workload, WORKLOADS};
