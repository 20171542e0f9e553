//! The host's cumulative counters at one instant, and the conditions
//! between two samples.

use std::time::Instant;

pub(super) const MIB: f64 = 1024.0 * 1024.0;
/// Linux reports `/proc` CPU times in USER_HZ ticks, 100 per second on every
/// architecture it exposes them on.
pub(super) const USER_HZ: f64 = 100.0;

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
    pub(super) fn total(&self) -> u64 {
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

/// The middle value of `v` (the upper one of an even count; None when empty).
pub(super) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}
