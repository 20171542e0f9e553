//! The matrix in rounds: each round a probe step, then every cell in an order
//! that alternates round by round; `--until-stable` adds rounds until the
//! paired ratios are narrow enough; the baseline runs once more at the end.

use super::balloon::{self, Balloon};
use super::cell_run::run_cell;
use super::env::BenchEnv;
use super::probe::{probe_line, probe_round};
use super::{
    bound::RoundProbe, error::BenchError, plan::BenchPlan, plan::UntilStable, summary::RunResult,
};

/// The matrix as it ran: every run and every round's probe.
#[derive(Default)]
pub(super) struct Matrix {
    pub(super) results: Vec<RunResult>,
    pub(super) probes: Vec<RoundProbe>,
    pub(super) baseline_text: Option<Vec<u8>>,
    /// The signal that stopped it early, if any.
    pub(super) interrupted: Option<i32>,
    /// What `--until-stable` concluded (None without it).
    pub(super) stability: Option<String>,
}

/// Run the rounds (a probe step, then every cell in order), with
/// `--until-stable` adding rounds until the paired ratios are narrow enough,
/// then the baseline once more in a round of its own; stops early on a signal.
pub(super) fn run_matrix(env: &BenchEnv, balloon: Option<&Balloon>) -> Result<Matrix, BenchError> {
    let plan = env.plan;
    let rounds = plan.max_rounds();
    let mut m = Matrix::default();
    let mut last = 0;
    for round in 1..=rounds {
        last = round;
        if !run_round(env, &mut m, round, plan.cells.len(), balloon)? {
            return Ok(m);
        }
        if let Some(s) = plan.until_stable {
            if round >= plan.repeats.max(2) && stable_note(plan, &m, s, round, false).is_some() {
                break;
            }
        }
    }
    if let Some(s) = plan.until_stable {
        m.stability = stable_note(plan, &m, s, last, true);
        crate::say!(
            "bench: --until-stable: {}",
            m.stability.as_deref().unwrap_or("")
        );
    }
    run_round(env, &mut m, last + 1, 1, balloon)?;
    Ok(m)
}

/// With `--until-stable`: the note when every cell's paired ratio has an
/// interval narrower than asked (or, when `at_end`, whatever the state).
fn stable_note(
    plan: &BenchPlan,
    m: &Matrix,
    s: UntilStable,
    rounds: u32,
    at_end: bool,
) -> Option<String> {
    let wide: Vec<String> = (1..plan.cells.len())
        .filter_map(|ci| {
            let w = super::summary::cell_ratio(&m.results, ci, false).and_then(|r| r.width());
            (!w.is_some_and(|w| w < s.width)).then(|| {
                let w = w.map_or_else(|| "none".to_string(), |w| format!("{w:.3}"));
                format!("{} ({w})", plan.cells[ci].name)
            })
        })
        .collect();
    if wide.is_empty() {
        return Some(format!(
            "every cell's ratio to the baseline had a 95% interval narrower than {} (relative) \
             after {rounds} rounds",
            s.width
        ));
    }
    at_end.then(|| {
        format!(
            "LIMIT HIT: {rounds} rounds (--max-repeats) and still as wide as {} (relative) \
             or wider: {}",
            s.width,
            wide.join(", ")
        )
    })
}

/// The order of a round's cells: forward in odd rounds, backward in even
/// ones (A B C, C B A). A cell that reads what the cell before it just read
/// finds it in any cache below the guest (a virtual disk's host), so a fixed
/// order would favour the second of every pair of neighbours; alternating
/// puts each of them second in half the rounds. Round 1 is forward, so the
/// baseline's first run (whose text every other run is compared with) comes
/// first.
pub(crate) fn round_order(round: u32, n_cells: usize) -> Vec<usize> {
    match round % 2 {
        0 => (0..n_cells).rev().collect(),
        _ => (0..n_cells).collect(),
    }
}

/// One round: its probe step, then cells `0..n_cells` in [`round_order`];
/// false when a signal stopped it.
fn run_round(
    env: &BenchEnv,
    m: &mut Matrix,
    round: u32,
    n_cells: usize,
    balloon: Option<&Balloon>,
) -> Result<bool, BenchError> {
    match probe_round(env, round, m.probes.last()) {
        Ok(p) => {
            crate::say!("bench: round {round} probe: {}", probe_line(&p));
            m.probes.push(p);
        }
        Err(BenchError::Interrupted(sig)) => {
            m.interrupted = Some(sig);
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    for ci in round_order(round, n_cells) {
        if let Some(sig) = crate::interrupt::requested() {
            m.interrupted = Some(sig);
            return Ok(false);
        }
        check_balloon(balloon)?;
        let k = m.results.len() + 1;
        let neighbour = env.plan.busy_neighbour_runs.contains(&k);
        let cell = &env.plan.cells[ci];
        let stem = env.runs_dir.join(format!("{}-{round}", cell.name));
        let (r, line) = run_cell(env, ci, round, &stem, neighbour, &mut m.baseline_text)?;
        crate::say!(
            "bench: [{k}] round {round} {}: {line} ({:.1} s){}",
            cell.name,
            r.wall_s,
            if neighbour { " [busy neighbour]" } else { "" }
        );
        m.results.push(r);
    }
    Ok(true)
}

/// Fail when the balloon no longer holds its memory (paged out to swap): the
/// remaining runs would not be under the limit.
fn check_balloon(balloon: Option<&Balloon>) -> Result<(), BenchError> {
    if balloon.is_some_and(|b| !b.still_held()) {
        return Err(BenchError::Balloon(format!(
            "less than {:.0}% of the balloon is still in memory (paged out to swap?); \
             the remaining runs would not be under the asked memory limit",
            balloon::HELD_SHARE * 100.0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn rounds_alternate_their_order_and_the_first_is_forward() {
        use super::round_order;
        assert_eq!(round_order(1, 3), vec![0, 1, 2]);
        assert_eq!(round_order(2, 3), vec![2, 1, 0]);
        assert_eq!(round_order(3, 3), vec![0, 1, 2]);
        // The baseline's own last round.
        assert_eq!(round_order(4, 1), vec![0]);
        // Each neighbour goes second in half of any even number of rounds.
        let (mut a_first, mut b_first) = (0, 0);
        for r in 1..=4 {
            let o = round_order(r, 4);
            let pos = |c| o.iter().position(|&x| x == c).unwrap();
            if pos(1) < pos(2) {
                a_first += 1
            } else {
                b_first += 1
            }
        }
        assert_eq!((a_first, b_first), (2, 2));
    }
}
