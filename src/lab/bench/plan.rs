//! What a bench is asked to do ([`BenchPlan`], resolved and validated by the
//! CLI) and what it produced ([`BenchOutcome`]).

use std::path::PathBuf;
use std::time::Duration;

use super::{cells::Cell, summary::CellSummary};

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
    /// What every run generates.
    pub workload: Workload,
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
    /// `--route-from TRACE`: every run's routing forced by the trace (the
    /// cells', the traced run's and the resident probe's).
    pub route_from: Option<PathBuf>,
}

impl BenchPlan {
    /// The most rounds the matrix may run (the baseline's extra round aside).
    pub(crate) fn max_rounds(&self) -> u32 {
        let repeats = self.repeats.max(1);
        self.until_stable
            .map_or(repeats, |s| s.max_rounds.max(repeats))
    }
}

/// The bench's prompt (`-w`: its name and text) and tokens a run (`-n`).
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub prompt: String,
    pub tokens: u32,
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
