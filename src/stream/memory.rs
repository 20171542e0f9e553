//! Host memory facts (MemAvailable, RSS, faults, CPU time) and what is done to
//! llama.cpp's mapping of the model file: dropping the expert ranges after load,
//! warming or locking the dense ranges.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::error::StreamError;

/// The one parser of the kernel's `key: value` files (`/proc/meminfo`,
/// `/proc/self/status`, `/proc/self/io`): `key`'s number, a value in kB
/// returned in bytes.
pub fn proc_key(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(key))?;
    let mut it = line.split(':').nth(1)?.split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    Some(if it.next() == Some("kB") {
        n.saturating_mul(1024)
    } else {
        n
    })
}

/// `key` of /proc/meminfo (`MemAvailable`, `MemTotal`, ...), in bytes.
pub fn meminfo_bytes(key: &str) -> Option<u64> {
    proc_key(&std::fs::read_to_string("/proc/meminfo").ok()?, key)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable")
}

/// Current and peak resident set size of this process, in bytes.
pub(crate) fn rss_bytes() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| proc_key(&s, name).unwrap_or(0);
    (field("VmRSS"), field("VmHWM"))
}

/// Reset the kernel's peak-RSS mark so that VmHWM covers only what follows.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes this process has caused to be read from storage (/proc/self/io read_bytes).
pub(crate) fn io_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find(|l| l.starts_with("read_bytes:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Major faults and CPU time (user + system) of this process.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    pub(crate) majflt: u64,
    pub(crate) minflt: u64,
    pub(crate) cpu_ms: f64,
}

pub(crate) fn usage() -> Usage {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return Usage::default();
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    Usage {
        majflt: ru.ru_majflt as u64,
        minflt: ru.ru_minflt as u64,
        cpu_ms: tv(ru.ru_utime) + tv(ru.ru_stime),
    }
}

/// llama.cpp's read-only mapping of the model file in this process. llama.cpp
/// maps the whole file, then unmaps fragments it does not need (the header,
/// unused tensors), so the mapping is a set of intervals around one base.
pub(crate) struct FileMapping {
    base: usize,
    /// Mapped intervals as file offsets [start, end).
    mapped: Vec<(usize, usize)>,
    len: usize,
    file: File,
}

impl FileMapping {
    /// Bases of the mappings of `path` that exist now (before llama.cpp loads it),
    /// so that [`FileMapping::find`] can tell llama.cpp's new one apart.
    pub(crate) fn existing_bases(path: &Path) -> Vec<usize> {
        let Ok(canon) = std::fs::canonicalize(path) else {
            return Vec::new();
        };
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let want = canon.to_string_lossy();
        maps.lines()
            .filter_map(|line| {
                let mut it = line.split_whitespace();
                let (range, _, offset) = (it.next()?, it.next()?, it.next()?);
                let name: String = it.skip(2).collect::<Vec<_>>().join(" ");
                if name != want {
                    return None;
                }
                let a = usize::from_str_radix(range.split_once('-')?.0, 16).ok()?;
                let off = usize::from_str_radix(offset, 16).ok()?;
                Some(a.wrapping_sub(off))
            })
            .collect()
    }

    /// Find the mapping of `path` in /proc/self/maps, skipping mappings whose
    /// base is in `exclude` (they existed before this model was loaded).
    pub(crate) fn find(path: &Path, exclude: &[usize]) -> Result<Self, StreamError> {
        let canon = std::fs::canonicalize(path).map_err(|e| StreamError::Io {
            what: format!("resolve {}", path.display()),
            source: e,
        })?;
        let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| StreamError::Io {
            what: "read /proc/self/maps".into(),
            source: e,
        })?;
        let want = canon.to_string_lossy();
        let mut base = None;
        let mut mapped = Vec::new();
        for line in maps.lines() {
            let mut it = line.split_whitespace();
            let (Some(range), Some(_perms), Some(offset)) = (it.next(), it.next(), it.next())
            else {
                continue;
            };
            let name: String = it.skip(2).collect::<Vec<_>>().join(" ");
            if name != want {
                continue;
            }
            let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
            let (Ok(a), Ok(b), Ok(off)) = (
                usize::from_str_radix(a, 16),
                usize::from_str_radix(b, 16),
                usize::from_str_radix(offset, 16),
            ) else {
                continue;
            };
            let this_base = a.wrapping_sub(off);
            if exclude.contains(&this_base) {
                continue;
            }
            if *base.get_or_insert(this_base) != this_base {
                // A second, unrelated mapping of the same file: not llama.cpp's.
                continue;
            }
            mapped.push((off, off + (b - a)));
        }
        let Some(base) = base else {
            return Err(StreamError::NoMapping(canon.display().to_string()));
        };
        let len = mapped.iter().map(|m| m.1).max().unwrap_or(0);
        let file = File::open(&canon).map_err(|e| StreamError::Io {
            what: format!("open {}", canon.display()),
            source: e,
        })?;
        Ok(Self {
            base,
            mapped,
            len,
            file,
        })
    }

    /// The mapped intervals as address ranges.
    pub(crate) fn address_ranges(&self) -> Vec<(usize, usize)> {
        self.mapped
            .iter()
            .map(|&(a, b)| (self.base + a, self.base + b))
            .collect()
    }

    /// The mapped parts of [off, off+len), as file-offset intervals.
    fn mapped_parts(&self, off: u64, len: u64) -> Vec<(usize, usize)> {
        let (a, b) = (off as usize, (off + len) as usize);
        self.mapped
            .iter()
            .filter_map(|&(s, e)| {
                let (x, y) = (a.max(s), b.min(e));
                (y > x).then_some((x, y))
            })
            .collect()
    }

    fn page() -> usize {
        // SAFETY: sysconf has no preconditions.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
    }

    /// Whole pages inside [off, off+len) that are mapped.
    fn pages(&self, off: u64, len: u64) -> Vec<(usize, usize)> {
        let page = Self::page();
        self.mapped_parts(off, len)
            .into_iter()
            .filter_map(|(a, b)| {
                let begin = a.div_ceil(page) * page;
                let end = (b / page * page).min(self.len);
                (end > begin).then_some((begin, end - begin))
            })
            .collect()
    }

    /// Unmap the pages of [off, off+len) from this process and drop them from the
    /// page cache, so the run starts cold for those bytes.
    pub(crate) fn drop_range(&self, off: u64, len: u64) {
        for (o, l) in self.pages(off, len) {
            // Bmoe never lets a kernel read these expert bytes from the mapping.
            // inside llama.cpp's read-only shared file mapping, MADV_DONTNEED
            // only drops page-table entries (an access would fault the file back in).
            // SAFETY: as the comment above says.
            unsafe { libc::madvise((self.base + o) as *mut libc::c_void, l, libc::MADV_DONTNEED) };
        }
        // SAFETY: plain advisory call on our own file descriptor.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                off as i64,
                len as i64,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    /// Touch every page of [off, off+len) once, so the dense weights are resident.
    pub(crate) fn warm_range(&self, off: u64, len: u64) -> u64 {
        let page = Self::page();
        let mut sum = 0u64;
        for (a, b) in self.mapped_parts(off, len) {
            let start = a / page * page;
            // Ask for the whole range first (large sequential reads), then touch it.
            // SAFETY: advisory only, on a page-aligned part of our read-only mapping.
            unsafe {
                libc::madvise(
                    (self.base + start) as *mut libc::c_void,
                    b - start,
                    libc::MADV_WILLNEED,
                )
            };
            let mut p = a;
            while p < b {
                // SAFETY: p lies in a mapped, readable (PROT_READ) interval.
                sum = sum.wrapping_add(unsafe {
                    std::ptr::read_volatile((self.base + p) as *const u8)
                } as u64);
                p = (p / page + 1) * page;
            }
        }
        sum
    }

    /// mlock [off, off+len).
    pub(crate) fn lock_range(&self, off: u64, len: u64) -> std::io::Result<()> {
        for (a, b) in self.mapped_parts(off, len) {
            // SAFETY: [a, b) is a mapped interval; mlock only pins its pages.
            let rc = unsafe { libc::mlock((self.base + a) as *const libc::c_void, b - a) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Drop the whole pages inside [addr, addr+len) of a read-only file mapping
/// from this process (a later access would fault them back in from the file).
pub(crate) fn drop_pages(addr: usize, len: usize) {
    let page = FileMapping::page();
    let begin = addr.div_ceil(page) * page;
    let end = (addr + len) / page * page;
    if end > begin {
        // The range lies inside a read-only shared file mapping (caller);
        // MADV_DONTNEED only discards page-table entries for clean file pages.
        // SAFETY: as the comment above says.
        unsafe { libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_DONTNEED) };
    }
}

/// RLIMIT_MEMLOCK soft limit in bytes (None: unlimited).
pub(crate) fn memlock_limit_bytes() -> Option<u64> {
    // SAFETY: getrlimit writes into the struct we own.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Some(0);
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}
