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

use std::path::Path;
use std::time::{Duration, Instant};

const MIB: f64 = 1024.0 * 1024.0;
/// Linux reports `/proc` CPU times in USER_HZ ticks, 100 per second on every
/// architecture it exposes them on.
const USER_HZ: f64 = 100.0;

/// Where the flags' thresholds are set: a run is flagged when a disturbance
/// exceeds its reference run's by more than this.
pub const OTHER_CPU_CORES_LIMIT: f64 = 0.25;
pub const STEAL_CORES_LIMIT: f64 = 0.10;
pub const OTHER_READ_MIB_S_LIMIT: f64 = 16.0;
/// MemAvailable at the start may differ from the reference's by this share of MemTotal.
pub const MEM_AVAILABLE_SHARE_LIMIT: f64 = 0.10;
/// The device's ms/read in a run may differ from the median of the same
/// cell's runs by this factor, either way (same reads, so a different device).
pub const DEVICE_MS_FACTOR_LIMIT: f64 = 1.5;
/// Fewer reads than this make ms/read too thin to judge.
pub const DEVICE_MIN_READS: u64 = 256;
/// A run whose CPU kernel (sampled while it ran) is this factor slower or
/// faster than its reference's is flagged: the counters above miss a CPU
/// that runs at another speed (a host's frequency or a neighbour on the
/// same physical core).
pub const CPU_KERNEL_FACTOR_LIMIT: f64 = 1.10;
/// Steps of one CPU kernel sample: a dependent multiply-add chain of about
/// 2 ms on this host.
const CPU_KERNEL_STEPS: u32 = 500_000;
/// Time between two samples: 2 ms in 250 take under 1% of one core from the run.
const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
/// A run whose fresh-page time (sampled while it ran) is this factor slower or
/// faster than its reference's is flagged.
pub const FRESH_PAGE_FACTOR_LIMIT: f64 = 1.5;
/// Bytes of fresh anonymous memory one sample maps, writes page by page and
/// unmaps: 256 pages, well under a millisecond on a host that backs memory
/// at once, a few ms on one that does not.
const FRESH_SAMPLE_BYTES: usize = 1 << 20;
const PAGE_BYTES: usize = 4096;

impl HostSample {
    /// This sample with `thread`'s CPU time and faults taken out of the
    /// bench's own (a thread of the bench that stands for another process).
    pub fn without(self, thread: OwnStat) -> Self {
        let own = OwnStat {
            ticks: self.own.ticks.saturating_sub(thread.ticks),
            sys_ticks: self.own.sys_ticks.saturating_sub(thread.sys_ticks),
            minor_faults: self.own.minor_faults.saturating_sub(thread.minor_faults),
        };
        Self { own, ..self }
    }
}

/// Cumulative counters at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSample {
    pub at: Instant,
    pub cpu: CpuTicks,
    /// This process's and its reaped children's CPU time and faults.
    pub own: OwnStat,
    /// `read_bytes` of `/proc/self/io` (includes reaped children's).
    pub own_read_bytes: Option<u64>,
    pub disk: Option<DiskCounters>,
    pub mem_available_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub cached_bytes: Option<u64>,
}

/// What `/proc/self/stat` says of this process and its reaped children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnStat {
    /// utime + stime + cutime + cstime, in clock ticks.
    pub ticks: u64,
    /// stime + cstime: the part spent in the kernel.
    pub sys_ticks: u64,
    /// minflt + cminflt: page faults served without reading a file.
    pub minor_faults: u64,
}

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks summed over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTicks {
    /// user + nice + system + irq + softirq.
    pub busy: u64,
    /// idle + iowait.
    pub idle: u64,
    pub steal: u64,
    /// The `cpuN` lines: the CPUs the aggregate sums over.
    pub cpus: u32,
}

impl CpuTicks {
    fn total(&self) -> u64 {
        self.busy + self.idle + self.steal
    }
}

/// One device's line of `/proc/diskstats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCounters {
    pub reads: u64,
    pub read_bytes: u64,
    /// Milliseconds reads spent in the device's queue and service, summed.
    pub read_ticks_ms: u64,
    pub io_ticks_ms: u64,
}

/// What happened on the host between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conditions {
    pub wall_s: f64,
    /// CPU other processes took, in cores (1.0 = one core busy all along).
    pub other_cpu_cores: f64,
    /// Time the hypervisor gave to others, in cores.
    pub steal_cores: f64,
    /// Share of the wall time the model's device was busy (None: device unknown).
    pub disk_busy_share: Option<f64>,
    /// Mean milliseconds per read on the model's device, everyone's reads
    /// (None: device unknown or no read): how fast the device answered.
    pub read_ms: Option<f64>,
    /// Reads the device completed (0: device unknown).
    pub device_reads: u64,
    /// Bytes per second read from the model's device by anyone but this bench
    /// and its children.
    pub other_read_mib_s: Option<f64>,
    /// At the first sample.
    pub mem_available_mib: Option<f64>,
    pub cached_mib: Option<f64>,
    pub mem_total_mib: Option<f64>,
    /// Median milliseconds of the CPU kernel sampled during the interval
    /// ([`with_speed_samples`]; None: not sampled).
    pub cpu_kernel_ms: Option<f64>,
    /// Median microseconds to write one fresh anonymous page, sampled the same
    /// way (None: not sampled).
    pub fresh_page_us: Option<f64>,
    /// CPU seconds the bench and its reaped children spent in the kernel.
    pub own_sys_s: f64,
    /// Minor page faults of the bench and its reaped children.
    pub own_minor_faults: u64,
}

/// Parse the aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<CpuTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    Some(CpuTicks {
        busy: at(0) + at(1) + at(2) + at(5) + at(6),
        idle: at(3) + at(4),
        steal: at(7),
        cpus: u32::try_from(cpus).unwrap_or(u32::MAX).max(1),
    })
}

/// One thread's CPU ticks and minor faults from `/proc/self/task/TID/stat`
/// (fields 10, 14 and 15: its children's fields there are the whole
/// process's, so they are left out).
pub fn parse_thread_stat(text: &str) -> Option<OwnStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(OwnStat {
        ticks: field(14)? + field(15)?,
        sys_ticks: field(15)?,
        minor_faults: field(10)?,
    })
}

/// CPU ticks and minor faults from `/proc/self/stat` (fields 10-11 and 14-17;
/// the command name in parentheses may hold spaces, so fields count from its
/// `)`).
pub fn parse_self_stat(text: &str) -> Option<OwnStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, so field n is f[n - 3].
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(OwnStat {
        ticks: (14..=17).map(field).sum::<Option<u64>>()?,
        sys_ticks: field(15)? + field(17)?,
        minor_faults: field(10)? + field(11)?,
    })
}

/// A `key: value` of `/proc/self/io` or `/proc/meminfo` (values in kB for
/// meminfo are returned in bytes).
pub fn parse_key(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(key))?;
    let mut it = line.split(':').nth(1)?.split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    Some(if it.next() == Some("kB") { n * 1024 } else { n })
}

/// The line of `/proc/diskstats` for device `major:minor`.
pub fn parse_diskstats(text: &str, major: u32, minor: u32) -> Option<DiskCounters> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
        if num(0)? != u64::from(major) || num(1)? != u64::from(minor) {
            return None;
        }
        Some(DiskCounters {
            reads: num(3)?,
            read_bytes: num(5)? * 512,
            read_ticks_ms: num(6)?,
            io_ticks_ms: num(12)?,
        })
    })
}

/// The device (major, minor) holding `path`.
pub fn device_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    Some(split_dev(std::fs::metadata(path).ok()?.dev()))
}

/// Linux's encoding of a dev_t into (major, minor), as glibc's
/// `gnu_dev_major` / `gnu_dev_minor` decode it.
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// Sample the counters now; `device` is the model's (major, minor).
pub fn sample(device: Option<(u32, u32)>) -> HostSample {
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

/// Milliseconds of one fixed single-threaded dependent multiply-add chain:
/// how fast a core runs now.
pub fn time_cpu_kernel() -> f64 {
    let t0 = Instant::now();
    let mut x = std::hint::black_box(1.0f64);
    for i in 0..CPU_KERNEL_STEPS {
        x = x.mul_add(0.999_999_9, f64::from(i & 7) * 1e-9);
    }
    std::hint::black_box(x);
    t0.elapsed().as_secs_f64() * 1e3
}

/// Microseconds per page to write [`FRESH_SAMPLE_BYTES`] of a new anonymous
/// mapping, one byte a page (None if the mapping fails).
pub fn time_fresh_pages() -> Option<f64> {
    let mut m = memmap2::MmapMut::map_anon(FRESH_SAMPLE_BYTES).ok()?;
    let t0 = Instant::now();
    for i in (0..FRESH_SAMPLE_BYTES).step_by(PAGE_BYTES) {
        m[i] = 1;
    }
    std::hint::black_box(&m);
    let us = t0.elapsed().as_secs_f64() * 1e6;
    Some(us / (FRESH_SAMPLE_BYTES / PAGE_BYTES) as f64)
}

/// The medians of the speed kernels sampled while a run ran.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Speeds {
    pub cpu_kernel_ms: Option<f64>,
    pub fresh_page_us: Option<f64>,
}

impl Speeds {
    /// `c` with these medians in its speed fields.
    pub fn onto(self, c: Conditions) -> Conditions {
        Conditions {
            cpu_kernel_ms: self.cpu_kernel_ms,
            fresh_page_us: self.fresh_page_us,
            ..c
        }
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Run `work` while a thread beside it times the CPU kernel and the fresh
/// pages every [`CPU_SAMPLE_INTERVAL`]; returns its result and the samples'
/// medians (None when it ended before the first sample). The host's speed
/// moves within seconds on a shared host, so it is sampled across the run,
/// not before it.
pub fn with_speed_samples<T>(work: impl FnOnce() -> T) -> (T, Speeds) {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let sampler = s.spawn(move || {
            let (mut ms, mut us) = (Vec::new(), Vec::new());
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(CPU_SAMPLE_INTERVAL)
            {
                ms.push(time_cpu_kernel());
                us.extend(time_fresh_pages());
            }
            (ms, us)
        });
        let out = work();
        drop(stop);
        let (ms, us) = sampler.join().unwrap_or_default();
        let speeds = Speeds {
            cpu_kernel_ms: median(ms),
            fresh_page_us: median(us),
        };
        (out, speeds)
    })
}

/// The conditions between `a` and a later sample `b`.
pub fn conditions(a: &HostSample, b: &HostSample) -> Conditions {
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

/// Why `c` is flagged against the reference `r` (empty: not flagged).
pub fn flags(c: &Conditions, r: &Conditions) -> Vec<String> {
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
pub fn device_flag(c: &Conditions, cell: &[Conditions]) -> Option<String> {
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
pub fn quietest(cs: &[Conditions]) -> Option<Conditions> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_counters() {
        let stat = "cpu  100 5 20 300 40 1 2 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(
            parse_proc_stat(stat),
            Some(CpuTicks {
                busy: 128,
                idle: 340,
                steal: 7,
                cpus: 1
            })
        );
        let own = "4242 (b m) oe) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
        // minflt cminflt are 7 8, utime..cstime 11 12 13 14 (fields 10-11 and
        // 14-17 counted from the pid).
        assert_eq!(
            parse_self_stat(own),
            Some(OwnStat {
                ticks: 50,
                sys_ticks: 12 + 14,
                minor_faults: 15
            })
        );
        assert_eq!(parse_self_stat("1 (x) S 1 2"), None, "cut short");
        // A thread's own: utime stime (11 12) and minflt (7), not its
        // process's children's.
        let thread = parse_thread_stat(own).unwrap();
        assert_eq!(
            thread,
            OwnStat {
                ticks: 11 + 12,
                sys_ticks: 12,
                minor_faults: 7
            }
        );
        assert_eq!(parse_thread_stat("1 (x) S 1 2"), None, "cut short");
        let whole = parse_self_stat(own).unwrap();
        let sample = HostSample {
            at: Instant::now(),
            cpu: CpuTicks::default(),
            own: whole,
            own_read_bytes: None,
            disk: None,
            mem_available_bytes: None,
            mem_total_bytes: None,
            cached_bytes: None,
        };
        assert_eq!(
            sample.without(thread).own,
            OwnStat {
                ticks: 50 - 23,
                sys_ticks: 26 - 12,
                minor_faults: 15 - 7
            }
        );
        let io = "rchar: 10\nread_bytes: 4096\nwrite_bytes: 0\n";
        assert_eq!(parse_key(io, "read_bytes"), Some(4096));
        let mem = "MemTotal:       1000 kB\nMemAvailable:    500 kB\nCached:  7 kB\n";
        assert_eq!(parse_key(mem, "MemAvailable"), Some(500 * 1024));
        assert_eq!(parse_key(mem, "Cached"), Some(7 * 1024));
        assert_eq!(parse_key(mem, "SwapCached"), None);
        let ds = "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0\n 254       0 vda 10 0 2048 5 0 0 0 0 0 77 9\n";
        assert_eq!(
            parse_diskstats(ds, 254, 0),
            Some(DiskCounters {
                reads: 10,
                read_bytes: 2048 * 512,
                read_ticks_ms: 5,
                io_ticks_ms: 77
            })
        );
        assert_eq!(parse_diskstats(ds, 254, 1), None);
    }

    fn sample_at(at: Instant, busy: u64, idle: u64, own: u64, disk_read: u64) -> HostSample {
        HostSample {
            at,
            cpu: CpuTicks {
                busy,
                idle,
                steal: 0,
                cpus: 2,
            },
            own: OwnStat {
                ticks: own,
                sys_ticks: own / 2,
                minor_faults: own * 3,
            },
            own_read_bytes: Some(0),
            disk: Some(DiskCounters {
                reads: disk_read / 4096,
                read_bytes: disk_read,
                read_ticks_ms: disk_read / (1 << 20),
                io_ticks_ms: 0,
            }),
            mem_available_bytes: Some(1 << 30),
            mem_total_bytes: Some(2 << 30),
            cached_bytes: Some(0),
        }
    }

    #[test]
    fn a_busy_neighbour_is_other_cpu_and_is_flagged() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(10);
        // 2 CPUs for 10 s at 100 Hz = 2000 ticks; we took 1000, someone else 900.
        let quiet = conditions(
            &sample_at(t0, 0, 0, 0, 0),
            &sample_at(t1, 1000, 1000, 1000, 0),
        );
        let busy = conditions(
            &sample_at(t0, 0, 0, 0, 0),
            &sample_at(t1, 1900, 100, 1000, 320 * 1024 * 1024),
        );
        assert!(quiet.other_cpu_cores.abs() < 1e-9);
        assert!((busy.other_cpu_cores - 0.9).abs() < 1e-9);
        // Our 1000 ticks: half of them in the kernel, three faults a tick.
        assert_eq!(quiet.own_sys_s, 5.0);
        assert_eq!(quiet.own_minor_faults, 3000);
        assert_eq!(busy.other_read_mib_s, Some(32.0));
        // 320 MiB in 4 KiB reads taking 320 ms in all.
        assert_eq!(busy.read_ms, Some(320.0 / (320.0 * 256.0)));
        assert_eq!(quiet.read_ms, None);
        assert!(flags(&quiet, &quiet).is_empty());
        let why = flags(&busy, &quiet);
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].starts_with("other processes 0.90 cores"), "{why:?}");
        // The quietest of both is the quiet one.
        let q = quietest(&[busy, quiet]).unwrap();
        assert_eq!(q.other_cpu_cores, quiet.other_cpu_cores);
        assert_eq!(q.other_read_mib_s, Some(0.0));
    }

    /// A quiet 10 s run's conditions with these speeds sampled.
    fn timed(speeds: Speeds) -> Conditions {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(10);
        speeds.onto(conditions(
            &sample_at(t0, 0, 0, 0, 0),
            &sample_at(t1, 1000, 1000, 1000, 0),
        ))
    }

    #[test]
    fn a_cpu_at_another_speed_is_flagged_both_ways() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(10);
        let run = |ms: f64| {
            timed(Speeds {
                cpu_kernel_ms: Some(ms),
                fresh_page_us: None,
            })
        };
        let reference = quietest(&[run(4.0), run(5.0), run(4.2)]).unwrap();
        assert_eq!(reference.cpu_kernel_ms, Some(4.2), "the median");
        assert!(flags(&run(4.5), &reference).is_empty(), "within 10%");
        let slow = flags(&run(5.0), &reference);
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert!(
            slow[0].starts_with("CPU 19% slower (kernel 5.00 ms"),
            "{slow:?}"
        );
        assert!(flags(&run(3.5), &reference)[0].starts_with("CPU 20% faster"));
        // Not timed: not judged.
        let untimed = conditions(&sample_at(t0, 0, 0, 0, 0), &sample_at(t1, 1, 1, 1, 0));
        assert!(flags(&untimed, &reference).is_empty());
        let (v, sp) =
            with_speed_samples(|| std::thread::sleep(std::time::Duration::from_millis(600)));
        assert_eq!(v, ());
        assert!(sp.cpu_kernel_ms.is_some_and(|m| m > 0.0), "{sp:?}");
        assert!(sp.fresh_page_us.is_some_and(|u| u > 0.0), "{sp:?}");
        assert_eq!(
            with_speed_samples(|| 7).1,
            Speeds::default(),
            "ended before the first sample"
        );
    }

    #[test]
    fn a_host_slow_to_back_fresh_memory_is_flagged_both_ways() {
        let run = |us: f64| {
            timed(Speeds {
                cpu_kernel_ms: Some(2.0),
                fresh_page_us: Some(us),
            })
        };
        let reference = quietest(&[run(0.4), run(9.0), run(0.5)]).unwrap();
        assert_eq!(reference.fresh_page_us, Some(0.5), "the median");
        assert!(flags(&run(0.7), &reference).is_empty(), "within 1.5x");
        let slow = flags(&run(13.0), &reference);
        assert_eq!(
            slow,
            ["fresh memory 26.0x slower (13.00 us/page, reference 0.50)"]
        );
        assert!(flags(&run(0.3), &reference)[0].starts_with("fresh memory 1.7x faster"));
    }

    #[test]
    fn a_run_on_a_faster_device_is_off_its_cells_median() {
        let at = |ms: f64, reads: u64| Conditions {
            wall_s: 10.0,
            other_cpu_cores: 0.0,
            steal_cores: 0.0,
            disk_busy_share: None,
            read_ms: Some(ms),
            device_reads: reads,
            other_read_mib_s: None,
            mem_available_mib: None,
            cached_mib: None,
            mem_total_mib: None,
            cpu_kernel_ms: None,
            fresh_page_us: None,
            own_sys_s: 0.0,
            own_minor_faults: 0,
        };
        let cell = [at(3.6, 900), at(3.7, 900), at(1.6, 900), at(3.5, 900)];
        let why = device_flag(&cell[2], &cell).unwrap();
        assert!(
            why.starts_with("device 1.60 ms/read (2.2x off the cell's"),
            "{why}"
        );
        assert_eq!(device_flag(&cell[0], &cell), None);
        // Thin runs are not judged, nor is a cell with fewer than three judged runs.
        assert_eq!(device_flag(&at(1.0, 10), &cell), None);
        assert_eq!(device_flag(&cell[2], &cell[1..3]), None);
    }

    #[test]
    fn dev_t_splits_into_major_and_minor() {
        assert_eq!(split_dev(0xfe00), (254, 0));
        assert_eq!(split_dev(0x10301), (259, 1));
        assert_eq!(split_dev(0x100800), (8, 256));
    }
}
