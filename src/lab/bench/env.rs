//! What every step of a bench reads.

use std::path::PathBuf;

use super::plan::BenchPlan;
use super::traced::ProbePlan;
use crate::layout::MoeLayout;

/// What every step of a bench reads: the plan, where its files go, the
/// model's layout and device, and the resident rate fixed before a balloon.
pub(super) struct BenchEnv<'a> {
    pub(super) plan: &'a BenchPlan,
    pub(super) runs_dir: PathBuf,
    pub(super) prompt_path: PathBuf,
    pub(super) layout: MoeLayout,
    /// What the read probe reads (the workload's routed slices, and per cache
    /// size the slices it misses on, when traced) and which set bounds each cell.
    pub(super) probe: ProbePlan,
    pub(super) device: Option<(u32, u32)>,
    /// Measured once before the balloon: under it the page cache cannot hold
    /// the model and a resident run would be a disk measurement.
    pub(super) fixed_resident_tok_s: Option<f64>,
}
