//! The host conditions on made-up counters: parsing, a busy neighbour, a CPU
//! and a memory at another speed, a device off its cell's median.

use std::time::Instant;

use super::counters::{CpuTicks, DiskCounters, OwnStat};
use super::proc::split_dev;
use super::speed::Speeds;
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
    let ds =
        "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0\n 254       0 vda 10 0 2048 5 0 0 0 0 0 77 9\n";
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
    let (v, sp) = with_speed_samples(|| std::thread::sleep(std::time::Duration::from_millis(600)));
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
