//! Loading a streamed model without reading its experts.
//!
//! llama.cpp maps a model file with `MAP_POPULATE` and then advises
//! `POSIX_MADV_WILLNEED` over the whole mapping: a cold load reads every byte
//! of the file, experts included, before bmoe drops the expert ranges. For a
//! file several times the host's memory that is minutes of I/O and a page
//! cache churned for nothing. llama.cpp has no setting for it (its prefetch is
//! fixed on for mmap loads), so bmoe, without patching llama.cpp, defines the
//! two C functions llama.cpp calls for it, `mmap` and `posix_madvise`: this
//! executable's definitions take precedence over the C library's for every
//! caller in the process. Both forward to the kernel unchanged, except while
//! a load is armed ([`Armed`]) for a mapping of one of the armed files: there
//! `MAP_POPULATE` is dropped and `WILLNEED` is skipped. bmoe then warms (or
//! locks, or copies) only the dense ranges itself, after the load.
//!
//! The state is a fixed table of atomics: `mmap` can be called from any
//! thread at any time (allocators, thread stacks), so it takes no lock and
//! allocates nothing.

use std::os::raw::{c_int, c_long, c_void};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Files (shards) one load can arm.
const MAX_FILES: usize = 64;

/// Whether a load is armed (checked first: the common path is one load).
static ARMED: AtomicBool = AtomicBool::new(false);
/// The armed files' (device, inode), 0 = empty.
static FILES: [(AtomicU64, AtomicU64); MAX_FILES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_FILES];
/// The mappings made of armed files while armed: (address, length).
static MAPS: [(AtomicUsize, AtomicUsize); MAX_FILES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_FILES];
/// Mappings made without their populate while armed (for tests and reports).
static UNPOPULATED: AtomicU64 = AtomicU64::new(0);
/// One armed load at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// While alive, llama.cpp's mappings of the given files are made without
/// populating them. Dropping it disarms.
pub(crate) struct Armed {
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Armed {
    /// Arm for `paths` (a model's files); files that cannot be stat'ed (or more
    /// than the table holds) are left alone and load as before.
    pub(crate) fn new(paths: &[&Path]) -> Self {
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for (slot, p) in FILES.iter().zip(paths) {
            if let Ok(m) = std::fs::metadata(p) {
                slot.0.store(m.dev(), Ordering::SeqCst);
                slot.1.store(m.ino(), Ordering::SeqCst);
            }
        }
        ARMED.store(true, Ordering::SeqCst);
        Self { _guard: guard }
    }

    /// Mappings made unpopulated since the process started.
    #[cfg(test)]
    pub(crate) fn unpopulated_total() -> u64 {
        UNPOPULATED.load(Ordering::SeqCst)
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        ARMED.store(false, Ordering::SeqCst);
        for (d, i) in &FILES {
            d.store(0, Ordering::SeqCst);
            i.store(0, Ordering::SeqCst);
        }
        for (a, l) in &MAPS {
            a.store(0, Ordering::SeqCst);
            l.store(0, Ordering::SeqCst);
        }
    }
}

/// Whether `fd` is one of the armed files.
fn is_armed_file(fd: c_int) -> bool {
    // SAFETY: all zeroes is a valid `stat` (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // An invalid fd makes fstat fail with EBADF, which is handled.
    // SAFETY: fstat writes only into `st`, a struct we own.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    FILES.iter().any(|(d, i)| {
        let ino = i.load(Ordering::SeqCst);
        ino != 0 && ino == st.st_ino && d.load(Ordering::SeqCst) == st.st_dev
    })
}

fn remember_map(addr: usize, len: usize) {
    for (a, l) in &MAPS {
        if a.compare_exchange(0, addr, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            l.store(len, Ordering::SeqCst);
            return;
        }
    }
}

fn in_remembered_map(addr: usize, len: usize) -> bool {
    MAPS.iter().any(|(a, l)| {
        let (start, n) = (a.load(Ordering::SeqCst), l.load(Ordering::SeqCst));
        start != 0 && addr >= start && addr.saturating_add(len) <= start + n
    })
}

/// The C library's `mmap`, as the kernel call it wraps (errno set on failure).
///
/// # Safety
/// As `mmap(2)`: the caller owns what it maps and unmaps.
#[no_mangle]
// MAP_POPULATE is advisory: dropping it on the armed files leaves the same mapping.
// SAFETY: the C library's contract, forwarded to the kernel unchanged but for that.
pub(crate) unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: libc::size_t,
    prot: c_int,
    mut flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    let strip = ARMED.load(Ordering::SeqCst)
        && flags & libc::MAP_POPULATE != 0
        && fd >= 0
        && is_armed_file(fd);
    if strip {
        flags &= !libc::MAP_POPULATE;
    }
    // Every argument widened to the kernel's register width (the variadic
    // `syscall` reads longs); it sets errno and returns -1 (MAP_FAILED) on failure.
    let (prot, flags, fd) = (c_long::from(prot), c_long::from(flags), c_long::from(fd));
    // SAFETY: the same arguments as the caller's call, under its contract.
    let ret = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if strip && ret != -1 {
        UNPOPULATED.fetch_add(1, Ordering::SeqCst);
        remember_map(ret as usize, len);
    }
    ret as *mut c_void
}

/// The C library's `posix_madvise`: returns the error number (not errno);
/// `POSIX_MADV_DONTNEED` does nothing, as in glibc (it must not discard
/// data); `WILLNEED` over an unpopulated armed mapping is skipped.
///
/// # Safety
/// As `posix_madvise(3)`.
#[no_mangle]
// SAFETY: the C library's contract; advice only, nothing is mapped or freed.
pub(crate) unsafe extern "C" fn posix_madvise(
    addr: *mut c_void,
    len: libc::size_t,
    advice: c_int,
) -> c_int {
    if advice == libc::POSIX_MADV_DONTNEED {
        return 0;
    }
    if advice == libc::POSIX_MADV_WILLNEED
        && ARMED.load(Ordering::SeqCst)
        && in_remembered_map(addr as usize, len)
    {
        return 0;
    }
    let advice = c_long::from(advice);
    // SAFETY: the caller's arguments, under its contract (advice only).
    let r: c_long = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn only_armed_files_lose_their_populate() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        let mut other = tempfile::NamedTempFile::new().unwrap();
        other.write_all(&[8u8; 8192]).unwrap();
        let before = Armed::unpopulated_total();
        let map = |file: &std::fs::File| {
            // SAFETY: a fresh read-only private mapping of a file we own, unmapped below.
            let p = unsafe {
                mmap(
                    std::ptr::null_mut(),
                    8192,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_POPULATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the mapping just made is 8192 bytes long.
            let first = unsafe { *(p as *const u8) };
            // SAFETY: as above.
            unsafe { libc::munmap(p, 8192) };
            first
        };
        {
            let _armed = Armed::new(&[f.path()]);
            assert_eq!(map(f.as_file()), 7);
            assert_eq!(Armed::unpopulated_total(), before + 1);
            assert_eq!(map(other.as_file()), 8);
        }
        assert_eq!(
            Armed::unpopulated_total(),
            before + 1,
            "other file untouched"
        );
        map(f.as_file());
        assert_eq!(
            Armed::unpopulated_total(),
            before + 1,
            "disarmed after drop"
        );
    }
}
