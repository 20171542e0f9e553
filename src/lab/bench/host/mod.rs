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

mod flags;
mod proc;
mod speed;
#[cfg(test)]
mod tests;

use std::time::Instant;

pub(crate) use flags::{
    device_flag, flags, quietest, CPU_KERNEL_FACTOR_LIMIT, DEVICE_MIN_READS,
    DEVICE_MS_FACTOR_LIMIT, FRESH_PAGE_FACTOR_LIMIT, MEM_AVAILABLE_SHARE_LIMIT,
    OTHER_CPU_CORES_LIMIT, OTHER_READ_MIB_S_LIMIT, STEAL_CORES_LIMIT,
};
pub(crate) use proc::{
    device_of, parse_diskstats, parse_key, parse_proc_stat, parse_self_stat, parse_thread_stat,
};
pub(crate) use speed::with_speed_samples;

const MIB: f64 = 1024.0 * 1024.0;
/// Linux reports `/proc` CPU times in USER_HZ ticks, 100 per second on every
/// architecture it exposes them on.
const USER_HZ: f64 = 100.0;

/// Cumulative counters at one instant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostSample {
    pub(crate) at: Instant,
    pub(crate) cpu: CpuTicks,
    /// This process's and its reaped children's CPU time and faults.
    pub(crate) own: OwnStat,
    /// `read_bytes` of `/proc/self/io` (includes reaped children's).
    pub(crate) own_read_bytes: Option<u64>,
    pub(crate) disk: Option<DiskCounters>,
    pub(crate) mem_available_bytes: Option<u64>,
    pub(crate) mem_total_bytes: Option<u64>,
    pub(crate) cached_bytes: Option<u64>,
}

impl HostSample {
    /// This sample with `thread`'s CPU time and faults taken out of the
    /// bench's own (a thread of the bench that stands for another process).
    pub(crate) fn without(self, thread: OwnStat) -> Self {
        let own = OwnStat {
            ticks: self.own.ticks.saturating_sub(thread.ticks),
            sys_ticks: self.own.sys_ticks.saturating_sub(thread.sys_ticks),
            minor_faults: self.own.minor_faults.saturating_sub(thread.minor_faults),
        };
        Self { own, ..self }
    }
}

/// What `/proc/self/stat` says of this process and its reaped children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct OwnStat {
    /// utime + stime + cutime + cstime, in clock ticks.
    pub(crate) ticks: u64,
    /// stime + cstime: the part spent in the kernel.
    pub(crate) sys_ticks: u64,
    /// minflt + cminflt: page faults served without reading a file.
    pub(crate) minor_faults: u64,
}

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks summed over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CpuTicks {
    /// user + nice + system + irq + softirq.
    pub(crate) busy: u64,
    /// idle + iowait.
    pub(crate) idle: u64,
    pub(crate) steal: u64,
    /// The `cpuN` lines: the CPUs the aggregate sums over.
    pub(crate) cpus: u32,
}

impl CpuTicks {
    fn total(&self) -> u64 {
        self.busy + self.idle + self.steal
    }
}

/// One device's line of `/proc/diskstats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskCounters {
    pub(crate) reads: u64,
    pub(crate) read_bytes: u64,
    /// Milliseconds reads spent in the device's queue and service, summed.
    pub(crate) read_ticks_ms: u64,
    pub(crate) io_ticks_ms: u64,
}

/// What happened on the host between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Conditions {
    pub(crate) wall_s: f64,
    /// CPU other processes took, in cores (1.0 = one core busy all along).
    pub(crate) other_cpu_cores: f64,
    /// Time the hypervisor gave to others, in cores.
    pub(crate) steal_cores: f64,
    /// Share of the wall time the model's device was busy (None: device unknown).
    pub(crate) disk_busy_share: Option<f64>,
    /// Mean milliseconds per read on the model's device, everyone's reads
    /// (None: device unknown or no read): how fast the device answered.
    pub(crate) read_ms: Option<f64>,
    /// Reads the device completed (0: device unknown).
    pub(crate) device_reads: u64,
    /// Bytes per second read from the model's device by anyone but this bench
    /// and its children.
    pub(crate) other_read_mib_s: Option<f64>,
    /// At the first sample.
    pub(crate) mem_available_mib: Option<f64>,
    pub(crate) cached_mib: Option<f64>,
    pub(crate) mem_total_mib: Option<f64>,
    /// Median milliseconds of the CPU kernel sampled during the interval
    /// ([`with_speed_samples`]; None: not sampled).
    pub(crate) cpu_kernel_ms: Option<f64>,
    /// Median microseconds to write one fresh anonymous page, sampled the same
    /// way (None: not sampled).
    pub(crate) fresh_page_us: Option<f64>,
    /// CPU seconds the bench and its reaped children spent in the kernel.
    pub(crate) own_sys_s: f64,
    /// Minor page faults of the bench and its reaped children.
    pub(crate) own_minor_faults: u64,
}

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

/// The middle value of `v` (the upper one of an even count; None when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
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
