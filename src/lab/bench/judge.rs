//! Flags on the runs whose host conditions differ from their reference's
//! (the round's baseline run, or the quietest baseline run) beyond the
//! thresholds in [`super::host`], and on those whose device answered at a
//! speed off their cell's median.

use super::bound::RoundProbe;
use super::host;
use super::summary::RunResult;

/// Flag every run whose conditions differ from its reference beyond the
/// thresholds in [`host`]: a cell's reference is its round's baseline run;
/// the baseline's runs, a cell whose round's baseline run is itself flagged,
/// and the probe steps are held against the quietest baseline run.
pub(super) fn flag_conditions(results: &mut [RunResult], probes: &mut [RoundProbe]) {
    let base: Vec<host::Conditions> = results
        .iter()
        .filter(|r| r.cell == 0)
        .filter_map(|r| r.conditions)
        .collect();
    let Some(quiet) = host::quietest(&base) else {
        return;
    };
    for r in results.iter_mut().filter(|r| r.cell == 0) {
        if let Some(c) = r.conditions {
            r.flags = host::flags(&c, &quiet);
        }
    }
    for p in probes.iter_mut() {
        p.flags.extend(host::flags(&p.conditions, &quiet));
    }
    let references: Vec<(u32, host::Conditions)> = results
        .iter()
        .filter(|b| b.cell == 0 && b.flags.is_empty())
        .filter_map(|b| Some((b.run, b.conditions?)))
        .collect();
    for r in results.iter_mut().filter(|r| r.cell != 0) {
        let reference = references
            .iter()
            .find(|b| b.0 == r.run)
            .map_or(quiet, |b| b.1);
        if let Some(c) = r.conditions {
            r.flags = host::flags(&c, &reference);
        }
    }
    flag_device_speed(results);
}

/// Flag the runs whose device answered at a speed off their cell's median
/// (the same cell reads the same slices: a different speed is the device's).
/// Not against the round's other cells: cells of one cache size miss on the
/// same slices, but their time per read moves with how they queue (cache 0 in
/// one round: serial 3.3 ms, overlap with prediction 1.5 ms); a cell slow in
/// every run of a bench is for the comparison of two benches to show.
fn flag_device_speed(results: &mut [RunResult]) {
    let flags: Vec<Option<String>> = results
        .iter()
        .map(|r| {
            let cell: Vec<host::Conditions> = results
                .iter()
                .filter(|x| x.cell == r.cell)
                .filter_map(|x| x.conditions)
                .collect();
            host::device_flag(&r.conditions?, &cell)
        })
        .collect();
    for (r, f) in results.iter_mut().zip(flags) {
        r.flags.extend(f);
    }
}
