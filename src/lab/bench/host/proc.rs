//! Parsers of the kernel's counters: `/proc/stat`, `/proc/self/stat` and a
//! thread's stat, `key: value` files (`/proc/meminfo`, `/proc/self/io`),
//! `/proc/diskstats`, and the device a file lives on.

use std::path::Path;

use super::counters::{CpuTicks, DiskCounters, OwnStat};

/// Parse the aggregate `cpu` line of `/proc/stat`.
pub(crate) fn parse_proc_stat(text: &str) -> Option<CpuTicks> {
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
pub(crate) fn parse_thread_stat(text: &str) -> Option<OwnStat> {
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
pub(crate) fn parse_self_stat(text: &str) -> Option<OwnStat> {
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
/// meminfo are returned in bytes): the stream room's one parser of them.
pub(crate) use crate::stream::memory::proc_key as parse_key;

/// The line of `/proc/diskstats` for device `major:minor`.
pub(crate) fn parse_diskstats(text: &str, major: u32, minor: u32) -> Option<DiskCounters> {
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
pub(crate) fn device_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    Some(split_dev(std::fs::metadata(path).ok()?.dev()))
}

/// Linux's encoding of a dev_t into (major, minor), as glibc's
/// `gnu_dev_major` / `gnu_dev_minor` decode it.
pub(super) fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}
