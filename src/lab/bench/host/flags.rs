//! When a run's conditions differ from its reference's enough to flag it:
//! the thresholds, the reasons, the device-speed check against the cell's
//! median, and the quietest of a set of runs (the baseline's reference).

use super::counters::{median, Conditions};

/// Where the flags' thresholds are set: a run is flagged when a disturbance
/// exceeds its reference run's by more than this.
pub(crate) const OTHER_CPU_CORES_LIMIT: f64 = 0.25;
pub(crate) const STEAL_CORES_LIMIT: f64 = 0.10;
pub(crate) const OTHER_READ_MIB_S_LIMIT: f64 = 16.0;
/// MemAvailable at the start may differ from the reference's by this share of MemTotal.
pub(crate) const MEM_AVAILABLE_SHARE_LIMIT: f64 = 0.10;
/// The device's ms/read in a run may differ from the median of the same
/// cell's runs by this factor, either way (same reads, so a different device).
pub(crate) const DEVICE_MS_FACTOR_LIMIT: f64 = 1.5;
/// Fewer reads than this make ms/read too thin to judge.
pub(crate) const DEVICE_MIN_READS: u64 = 256;
/// A run whose CPU kernel (sampled while it ran) is this factor slower or
/// faster than its reference's is flagged: the counters above miss a CPU
/// that runs at another speed (a host's frequency or a neighbour on the
/// same physical core).
pub(crate) const CPU_KERNEL_FACTOR_LIMIT: f64 = 1.10;
/// A run whose fresh-page time (sampled while it ran) is this factor slower or
/// faster than its reference's is flagged.
pub(crate) const FRESH_PAGE_FACTOR_LIMIT: f64 = 1.5;

/// Why `c` is flagged against the reference `r` (empty: not flagged).
pub(crate) fn flags(c: &Conditions, r: &Conditions) -> Vec<String> {
    let mut out = Vec::new();
    if c.other_cpu_cores > r.other_cpu_cores + OTHER_CPU_CORES_LIMIT {
        out.push(format!(
            "other processes {:.2} cores (reference {:.2})",
            c.other_cpu_cores, r.other_cpu_cores
        ));
    }
    if c.steal_cores > r.steal_cores + STEAL_CORES_LIMIT {
        out.push(format!(
            "steal {:.2} cores (reference {:.2})",
            c.steal_cores, r.steal_cores
        ));
    }
    if let (Some(x), Some(y)) = (c.other_read_mib_s, r.other_read_mib_s) {
        if x > y + OTHER_READ_MIB_S_LIMIT {
            out.push(format!("other readers {x:.0} MiB/s (reference {y:.0})"));
        }
    }
    if let (Some(x), Some(y), Some(t)) = (c.mem_available_mib, r.mem_available_mib, c.mem_total_mib)
    {
        if (x - y).abs() > MEM_AVAILABLE_SHARE_LIMIT * t {
            out.push(format!("MemAvailable {x:.0} MiB (reference {y:.0})"));
        }
    }
    if let (Some(x), Some(y)) = (c.cpu_kernel_ms, r.cpu_kernel_ms) {
        if x > 0.0 && y > 0.0 && (x / y).max(y / x) > CPU_KERNEL_FACTOR_LIMIT {
            let how = if x > y { "slower" } else { "faster" };
            out.push(format!(
                "CPU {:.0}% {how} (kernel {x:.2} ms, reference {y:.2})",
                ((x / y).max(y / x) - 1.0) * 100.0
            ));
        }
    }
    if let (Some(x), Some(y)) = (c.fresh_page_us, r.fresh_page_us) {
        if x > 0.0 && y > 0.0 && (x / y).max(y / x) > FRESH_PAGE_FACTOR_LIMIT {
            let how = if x > y { "slower" } else { "faster" };
            out.push(format!(
                "fresh memory {:.1}x {how} ({x:.2} us/page, reference {y:.2})",
                (x / y).max(y / x)
            ));
        }
    }
    out
}

/// Why a run's device speed is off the median of its cell's runs (`cell`:
/// every run's conditions, this one's included); None when it is not, or
/// when too few reads make either side thin.
pub(crate) fn device_flag(c: &Conditions, cell: &[Conditions]) -> Option<String> {
    let judged = |c: &Conditions| {
        c.read_ms
            .filter(|ms| *ms > 0.0 && c.device_reads >= DEVICE_MIN_READS)
    };
    let ms = judged(c)?;
    let all: Vec<f64> = cell.iter().filter_map(judged).collect();
    if all.len() < 3 {
        return None;
    }
    let median = median(all)?;
    let factor = if ms > median {
        ms / median
    } else {
        median / ms
    };
    (factor > DEVICE_MS_FACTOR_LIMIT)
        .then(|| format!("device {ms:.2} ms/read ({factor:.1}x off the cell's median {median:.2})"))
}

/// The quietest of `cs`, metric by metric (the reference for the baseline's
/// own runs): least other CPU, steal and other reading, median MemAvailable.
pub(crate) fn quietest(cs: &[Conditions]) -> Option<Conditions> {
    let first = *cs.first()?;
    let min = |f: fn(&Conditions) -> f64| cs.iter().map(f).fold(f64::INFINITY, f64::min);
    let min_opt = |f: fn(&Conditions) -> Option<f64>| cs.iter().filter_map(f).reduce(f64::min);
    let avail: Vec<f64> = cs.iter().filter_map(|c| c.mem_available_mib).collect();
    let kernel: Vec<f64> = cs.iter().filter_map(|c| c.cpu_kernel_ms).collect();
    let fresh: Vec<f64> = cs.iter().filter_map(|c| c.fresh_page_us).collect();
    Some(Conditions {
        other_cpu_cores: min(|c| c.other_cpu_cores),
        steal_cores: min(|c| c.steal_cores),
        other_read_mib_s: min_opt(|c| c.other_read_mib_s),
        disk_busy_share: min_opt(|c| c.disk_busy_share),
        read_ms: min_opt(|c| c.read_ms),
        mem_available_mib: median(avail),
        cpu_kernel_ms: median(kernel),
        fresh_page_us: median(fresh),
        ..first
    })
}
