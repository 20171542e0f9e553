//! The host's conditions while a run ran, from the kernel's counters: CPU
//! time other processes took and steal time (`/proc/stat` against the bench's
//! own and its reaped children's time in `/proc/self/stat`), the model's
//! device busy time and bytes other readers read (`/proc/diskstats` against
//! `/proc/self/io`), MemAvailable and the page cache (`/proc/meminfo`), and
//! the bench's and its reaped children's kernel CPU time and minor page faults
//! (`/proc/self/stat`). Beside each run a thread times two small kernels (a
//! CPU chain, and writing fresh anonymous pages: how fast the host backs the
//! guest's new memory, which none of the counters show and which a run with a
//! large cache pays for every slot it fills).
//!
//! A sample is taken before a run is started and after it is reaped; the
//! difference is the run's [`Conditions`]. The busy-neighbour thread of the
//! self-test has its own ticks taken out of both samples
//! ([`HostSample::without`]), so its time counts as another's.

mod counters;
mod flags;
mod proc;
mod speed;
#[cfg(test)]
mod tests;

use std::time::Instant;

pub(crate) use counters::{Conditions, HostSample};
pub(crate) use flags::{
    device_flag, flags, quietest, CPU_KERNEL_FACTOR_LIMIT, DEVICE_MIN_READS,
    DEVICE_MS_FACTOR_LIMIT, FRESH_PAGE_FACTOR_LIMIT, MEM_AVAILABLE_SHARE_LIMIT,
    OTHER_CPU_CORES_LIMIT, OTHER_READ_MIB_S_LIMIT, STEAL_CORES_LIMIT,
};
pub(crate) use proc::{
    device_of, parse_diskstats, parse_key, parse_proc_stat, parse_self_stat, parse_thread_stat,
};
pub(crate) use speed::with_speed_samples;

use counters::{MIB, USER_HZ};

/// Sample the counters now; `device` is the model's (major, minor).
pub(crate) fn sample(device: Option<(u32, u32)>) -> HostSample {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let meminfo = read("/proc/meminfo");
    HostSample {
        at: Instant::now(),
        cpu: parse_proc_stat(&read("/proc/stat")).unwrap_or_default(),
        own: parse_self_stat(&read("/proc/self/stat")).unwrap_or_default(),
        own_read_bytes: parse_key(&read("/proc/self/io"), "read_bytes"),
        disk: device.and_then(|(ma, mi)| parse_diskstats(&read("/proc/diskstats"), ma, mi)),
        mem_available_bytes: parse_key(&meminfo, "MemAvailable"),
        mem_total_bytes: parse_key(&meminfo, "MemTotal"),
        cached_bytes: parse_key(&meminfo, "Cached"),
    }
}

/// The conditions between `a` and a later sample `b`.
pub(crate) fn conditions(a: &HostSample, b: &HostSample) -> Conditions {
    let n_cpus = b.cpu.cpus;
    let wall_s = b.at.duration_since(a.at).as_secs_f64();
    let total = b.cpu.total().saturating_sub(a.cpu.total());
    // Ticks to cores: `total` ticks are n_cpus cores for the whole interval.
    let cores = |ticks: u64| {
        if total == 0 {
            0.0
        } else {
            ticks as f64 * f64::from(n_cpus) / total as f64
        }
    };
    let busy = b.cpu.busy.saturating_sub(a.cpu.busy);
    let own = b.own.ticks.saturating_sub(a.own.ticks);
    let per_s = |x: f64| if wall_s > 0.0 { x / wall_s } else { 0.0 };
    let (device_reads, read_ms, disk_busy_share, other_read_mib_s) = match (a.disk, b.disk) {
        (Some(da), Some(db)) => {
            let reads = db.reads.saturating_sub(da.reads);
            let read_ms = db.read_ticks_ms.saturating_sub(da.read_ticks_ms) as f64;
            let busy_s = db.io_ticks_ms.saturating_sub(da.io_ticks_ms) as f64 / 1e3;
            let read = db.read_bytes.saturating_sub(da.read_bytes);
            let own_read = b
                .own_read_bytes
                .zip(a.own_read_bytes)
                .map_or(0, |(y, x)| y.saturating_sub(x));
            let other = read.saturating_sub(own_read) as f64 / MIB;
            (
                reads,
                (reads > 0).then(|| read_ms / reads as f64),
                Some(per_s(busy_s).min(1.0)),
                Some(per_s(other)),
            )
        }
        _ => (0, None, None, None),
    };
    let mib = |v: Option<u64>| v.map(|x| x as f64 / MIB);
    Conditions {
        wall_s,
        other_cpu_cores: cores(busy.saturating_sub(own)),
        steal_cores: cores(b.cpu.steal.saturating_sub(a.cpu.steal)),
        disk_busy_share,
        read_ms,
        device_reads,
        other_read_mib_s,
        mem_available_mib: mib(a.mem_available_bytes),
        cached_mib: mib(a.cached_bytes),
        mem_total_mib: mib(a.mem_total_bytes),
        cpu_kernel_ms: None,
        fresh_page_us: None,
        own_sys_s: b.own.sys_ticks.saturating_sub(a.own.sys_ticks) as f64 / USER_HZ,
        own_minor_faults: b.own.minor_faults.saturating_sub(a.own.minor_faults),
    }
}
