//! Engine-owned memory for expert slices: one reserved, lazily committed
//! address range per (layer, projection), laid out exactly like the stacked
//! tensor in the file (expert e at base + e * slice_bytes), so the matmul can
//! read it in place. Evicting releases the pages (`madvise(MADV_DONTNEED)`), so
//! RSS follows what the cache holds.

use super::error::{FlashError, LostMapping};
use super::map_budget::MapBudget;
use crate::proj::Proj;

/// One stacked expert tensor's region.
#[derive(Debug)]
struct Region {
    base: *mut u8,
    len: usize,
    slice_bytes: u64,
    file_offset: u64,
}

/// What the arena needs to know about one stacked expert tensor.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub layer: u32,
    pub proj: Proj,
    /// Absolute file offset of expert 0.
    pub file_offset: u64,
    pub slice_bytes: u64,
    pub n_expert: u32,
}

/// All expert regions. Addresses are stable for the arena's lifetime.
#[derive(Debug)]
pub struct Arena {
    regions: Vec<Option<Region>>,
    n_proj: usize,
    page: usize,
    /// Which slot ranges pages were moved into, within the mapping budget.
    moves: MapBudget,
    /// Set when a refused move left a hole that could not be mapped again:
    /// every later read fails with it ([`Arena::lost`]).
    lost: std::sync::OnceLock<LostMapping>,
}

// The arena only hands out raw addresses; who writes (the flash actor,
// for slots it is loading) and who reads (matmuls, for pinned slots) is
// serialized by the cache protocol, not by the arena itself.
// SAFETY: as the comment above says.
unsafe impl Send for Arena {}
// See Send; &Arena methods never write through the regions except
// `release`, whose callers guarantee the slot is not pinned.
// SAFETY: as the comment above says.
unsafe impl Sync for Arena {}

/// Three projections per expert.
pub const N_PROJ: usize = Proj::COUNT;

impl Arena {
    pub fn new(specs: &[TensorSpec]) -> Result<Self, FlashError> {
        Self::with_move_budget(specs, MapBudget::host_max_ranges())
    }

    /// As [`Arena::new`], with at most `max_moved_ranges` distinct slot
    /// ranges ever moved into (see [`MapBudget`]).
    pub(crate) fn with_move_budget(
        specs: &[TensorSpec],
        max_moved_ranges: usize,
    ) -> Result<Self, FlashError> {
        let page = page_bytes();
        let n_layer = specs
            .iter()
            .map(|s| s.layer as usize + 1)
            .max()
            .unwrap_or(0);
        let mut regions: Vec<Option<Region>> = (0..n_layer * N_PROJ).map(|_| None).collect();
        for s in specs {
            let len = (s.slice_bytes * s.n_expert as u64) as usize;
            let len = len.div_ceil(page) * page;
            // An anonymous private mapping with no address hint; no
            // existing memory is affected. MAP_NORESERVE: pages are committed
            // only when written, which is what keeps RSS at the cache's size.
            // SAFETY: as the comment above says.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len.max(page),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(FlashError::Os {
                    what: format!("reserve {len} bytes for layer {} expert tensor", s.layer),
                    source: std::io::Error::last_os_error(),
                });
            }
            regions[s.layer as usize * N_PROJ + s.proj.index()] = Some(Region {
                base: p as *mut u8,
                len: len.max(page),
                slice_bytes: s.slice_bytes,
                file_offset: s.file_offset,
            });
        }
        let stride = specs.iter().map(|s| s.n_expert as usize).max().unwrap_or(0);
        let moves = MapBudget::new(regions.len(), stride, max_moved_ranges);
        Ok(Self {
            regions,
            n_proj: N_PROJ,
            page,
            moves,
            lost: std::sync::OnceLock::new(),
        })
    }

    fn region(&self, layer: u32, proj: Proj) -> Option<&Region> {
        self.regions
            .get(layer as usize * self.n_proj + proj.index())
            .and_then(|r| r.as_ref())
    }

    /// Base address of (layer, proj): what the expert tensor's data pointer is bound to.
    pub fn base(&self, layer: u32, proj: Proj) -> Option<*mut u8> {
        self.region(layer, proj).map(|r| r.base)
    }

    /// Bytes reserved for (layer, proj).
    pub fn region_len(&self, layer: u32, proj: Proj) -> u64 {
        self.region(layer, proj).map(|r| r.len as u64).unwrap_or(0)
    }

    /// Whether pages may be moved into slot `to` of `proj` (the mapping budget).
    pub(crate) fn may_move_into(&self, proj: Proj, to: (u32, u32)) -> bool {
        self.moves.admit(self.region_index(proj, to), to.1)
    }

    fn region_index(&self, proj: Proj, slot: (u32, u32)) -> usize {
        slot.0 as usize * self.n_proj + proj.index()
    }

    /// Move `n` bytes of pages at `from` over slot `to`'s first inner pages at
    /// `dst` and record it; a hole a refusal left is mapped again, or the
    /// arena is marked lost. True when the pages moved.
    ///
    /// # Safety
    /// As [`remap`]'s.
    unsafe fn move_pages(
        &self,
        proj: Proj,
        from: usize,
        n: usize,
        to: (u32, u32),
        dst: usize,
    ) -> bool {
        // SAFETY: the caller's contract.
        match unsafe { remap(from, n, dst) } {
            Ok(Remapped::Refused) => false,
            Ok(r) => {
                // Moved or mapped again: [dst, dst + n) is a mapping of its own.
                let region = self.region_index(proj, to);
                self.moves.moved_into(region, to.1, n / self.page);
                r == Remapped::Moved
            }
            Err(e) => {
                let what = LostMapping {
                    layer: to.0,
                    proj,
                    expert: to.1,
                    bytes: n,
                    addr: dst,
                    cause: e.to_string(),
                };
                tracing::error!("{what}");
                self.lost.get_or_init(|| what);
                false
            }
        }
    }

    /// Why the arena's memory can no longer be read into, if a refused page
    /// move left a hole in it (see [`map_again`]).
    pub(crate) fn lost(&self) -> Option<&LostMapping> {
        self.lost.get()
    }

    /// `bytes` rounded up to whole pages.
    pub fn pages_of(&self, bytes: u64) -> usize {
        (bytes as usize).div_ceil(self.page) * self.page
    }

    /// (destination address, file offset, length) of one expert slice.
    pub fn slot(&self, layer: u32, proj: Proj, expert: u32) -> Option<(*mut u8, u64, u64)> {
        let r = self.region(layer, proj)?;
        let off = expert as u64 * r.slice_bytes;
        if off + r.slice_bytes > r.len as u64 {
            return None;
        }
        // SAFETY: off + slice_bytes <= len, so the address is inside the region.
        let dst = unsafe { r.base.add(off as usize) };
        Some((dst, r.file_offset + off, r.slice_bytes))
    }

    /// The whole pages inside a slot at `start` of `len` bytes: [begin, end).
    /// Only these belong to the slot alone (its first and last pages may be
    /// shared with its neighbours when slices are not page multiples).
    fn inner_pages(&self, start: *mut u8, len: u64) -> (usize, usize) {
        let start = start as usize;
        let begin = start.div_ceil(self.page) * self.page;
        let end = (start + len as usize) / self.page * self.page;
        (begin, end.max(begin))
    }

    /// Give the pages of one expert slot back to the kernel. Only whole pages
    /// inside the slot are released (a neighbour's bytes are never touched).
    /// Crate-private: only the flash actor may call it, and only for a slot the
    /// cache has evicted (no pin, so no matmul reads it).
    pub(crate) fn release(&self, layer: u32, proj: Proj, expert: u32) {
        let Some((dst, _, len)) = self.slot(layer, proj, expert) else {
            return;
        };
        let (begin, end) = self.inner_pages(dst, len);
        // SAFETY: [begin, end) is whole pages inside this slot (inner_pages),
        // which the caller guarantees no matmul reads (it is unpinned).
        unsafe { dont_need(begin, end - begin) };
    }

    /// Recycle the committed pages of slot `from` as slot `to` (same
    /// projection, same size): `mremap` moves the physical pages under `to`'s
    /// whole inner pages, so the read into `to` needs no page faults and no
    /// zeroing, and `from` becomes an empty reservation again. Slices need not
    /// be page multiples (gpt-oss's MXFP4 experts are not): the two slots' inner
    /// pages are counted apart, the smaller count moves (of `from`'s, only
    /// those that are one mapping: see [`MapBudget`]), and a page of `from`
    /// left over goes back to the kernel; the edge pages a slot shares with
    /// its neighbours are never touched. `MREMAP_DONTUNMAP` keeps `from` mapped
    /// throughout: unmapping it and mapping it again would leave a moment in
    /// which another thread's `mmap` (an allocation, a dense weight's anonymous
    /// copy) could be placed in the hole and then be replaced by the refill.
    /// Returns false (nothing moved) when the slots do not qualify or the
    /// kernel refuses (before Linux 5.7); the caller then releases `from`.
    /// Crate-private: only the flash actor may call it, with `from` evicted
    /// and `to` a miss being loaded (neither is read by a matmul meanwhile).
    pub(crate) fn move_slot(&self, proj: Proj, from: (u32, u32), to: (u32, u32)) -> bool {
        let (Some((src, _, len)), Some((dst, _, dlen))) =
            (self.slot(from.0, proj, from.1), self.slot(to.0, proj, to.1))
        else {
            return false;
        };
        let ((s_begin, s_end), (d_begin, d_end)) =
            (self.inner_pages(src, len), self.inner_pages(dst, dlen));
        // Only `from`'s pages that are one mapping may move (see MapBudget).
        let one = self.moves.one_mapping_pages(
            self.region_index(proj, from),
            from.1,
            (s_end - s_begin) / self.page,
        );
        let n = (one * self.page).min(d_end - d_begin);
        if len != dlen || n == 0 || from == to || !self.may_move_into(proj, to) {
            return false;
        }
        // `from` is evicted (unpinned) and `to` a miss being loaded, so no
        // matmul reads either while they move; both are whole pages inside
        // their own slots (inner_pages), and distinct slots never share one.
        // SAFETY: as the comment above says.
        if !unsafe { self.move_pages(proj, s_begin, n, to, d_begin) } {
            return false;
        }
        // SAFETY: what is left of `from`'s inner pages (what did not move), an
        // evicted slot's own.
        unsafe { dont_need(s_begin + n, s_end - s_begin - n) };
        true
    }

    /// Move up to `src_len` bytes of whole, backed pages at `src` (the
    /// toucher's cell) under slot `to`'s inner pages, so the read into `to`
    /// faults none of them in. Returns the bytes moved (0: nothing changed).
    /// Crate-private: only the flash actor may call it, for a miss being loaded.
    ///
    /// # Safety
    /// `[src, src + src_len)` is page-aligned private anonymous memory of the
    /// caller's, which nothing reads or writes meanwhile.
    pub(crate) unsafe fn move_in(
        &self,
        proj: Proj,
        to: (u32, u32),
        src: *mut u8,
        src_len: usize,
    ) -> usize {
        let Some((dst, _, len)) = self.slot(to.0, proj, to.1) else {
            return 0;
        };
        let (d_begin, d_end) = self.inner_pages(dst, len);
        let n = (d_end - d_begin).min(src_len / self.page * self.page);
        debug_assert_eq!(src as usize % self.page, 0);
        if n == 0 || !self.may_move_into(proj, to) {
            return 0;
        }
        // `to` is a miss being loaded (no matmul reads it) and [d_begin,
        // d_begin + n) is whole pages inside it; the source is the caller's.
        // SAFETY: as the comment above says, and the caller's contract.
        if !unsafe { self.move_pages(proj, src as usize, n, to, d_begin) } {
            return 0;
        }
        n
    }
}

/// This host's page size.
pub(crate) fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// What [`remap`] did; when the kernel refused (before Linux 5.7; a source
/// of two mappings), `from` is unchanged.
#[derive(Debug, PartialEq, Eq)]
enum Remapped {
    Moved,
    /// Refused, `to` untouched.
    Refused,
    /// Refused after unmapping `to`, which is fresh zero pages now.
    MappedAgain,
}

/// `mremap` `n` bytes of pages at `from` over the pages at `to`
/// (`MREMAP_FIXED` replaces them); `MREMAP_DONTUNMAP` keeps `from` mapped,
/// empty (it reads zero until written again). Err when the kernel refused,
/// left `to` unmapped, and it could not be mapped again ([`map_again`]).
///
/// # Safety
/// Both ranges are whole pages of private anonymous mappings of the caller's,
/// apart from each other, which nothing reads or writes meanwhile.
unsafe fn remap(from: usize, n: usize, to: usize) -> std::io::Result<Remapped> {
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    // SAFETY: the caller's contract above.
    let moved = unsafe {
        libc::mremap(
            from as *mut libc::c_void,
            n,
            n,
            flags,
            to as *mut libc::c_void,
        )
    };
    if moved != libc::MAP_FAILED {
        return Ok(Remapped::Moved);
    }
    let refused = std::io::Error::last_os_error();
    // SAFETY: `to` is the caller's (the contract above).
    unsafe { map_again(to, n) }.ok_or(refused)
}

/// Linux 5.7-6.15 unmap an `mremap`'s destination before they check its
/// source, so a refusal may leave [to, to + n) a hole, where another thread's
/// `mmap` could land: map the hole again with fresh zero pages, never over
/// another mapping (`MAP_FIXED_NOREPLACE`). None when part of it stays
/// unmapped.
///
/// # Safety
/// [to, to + n) is whole pages the caller owns and nothing reads meanwhile.
unsafe fn map_again(to: usize, n: usize) -> Option<Remapped> {
    let at = to as *mut libc::c_void;
    // madvise fails with ENOMEM where part of the range is not mapped.
    // SAFETY: MADV_NORMAL changes no contents; the range is the caller's.
    if unsafe { libc::madvise(at, n, libc::MADV_NORMAL) } == 0 {
        return Some(Remapped::Refused);
    }
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: NOREPLACE maps only where nothing is mapped, so no existing
    // memory is affected.
    let p = unsafe { libc::mmap(at, n, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    if p != at {
        // A kernel that ignored the flag placed it elsewhere: not ours to keep.
        // SAFETY: the mapping just made, of n bytes.
        unsafe { libc::munmap(p, n) };
        return None;
    }
    Some(Remapped::MappedAgain)
}

/// `madvise(MADV_DONTNEED)` of `len` bytes at `begin` (nothing when 0): on
/// private anonymous memory the pages go back to the kernel and read as zeros.
///
/// # Safety
/// The range is whole pages of a private anonymous mapping that nothing reads
/// or writes meanwhile.
unsafe fn dont_need(begin: usize, len: usize) {
    if len > 0 {
        // SAFETY: the caller's contract above.
        unsafe { libc::madvise(begin as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        for r in self.regions.iter().flatten() {
            // Each region was mapped in `new` with exactly this length and
            // is unmapped once; the engine drops the arena only after the contexts
            // that read it are gone.
            // SAFETY: as the comment above says.
            unsafe {
                libc::munmap(r.base as *mut libc::c_void, r.len);
            }
        }
    }
}

/// A page-aligned anonymous buffer (dense weights copied out of the page cache).
#[derive(Debug)]
pub struct AnonBuffer {
    ptr: *mut u8,
    len: usize,
}

// A plain owned allocation; synchronisation of its contents is the
// owner's business (the verify thread writes it once, then only kernels read it).
// SAFETY: as the comment above says.
unsafe impl Send for AnonBuffer {}

impl AnonBuffer {
    /// A fresh mapping of `len` bytes (at least one page), zero until written.
    pub fn zeroed(len: usize) -> Result<Self, FlashError> {
        let map_len = len.max(1);
        // SAFETY: anonymous private mapping, no hint; affects no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(FlashError::Os {
                what: format!("allocate {len} bytes of anonymous memory"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            ptr: p as *mut u8,
            len: map_len,
        })
    }

    /// A copy of `len` bytes starting at `src`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    // SAFETY: callers uphold the contract under # Safety above.
    pub unsafe fn copy_from(src: *const u8, len: usize) -> Result<Self, FlashError> {
        let buf = Self::zeroed(len)?;
        // `src` is readable for len bytes (caller), the buffer writable for
        // at least len bytes; a fresh mapping cannot overlap the source.
        // SAFETY: as the comment above says.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.ptr, len) };
        Ok(buf)
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AnonBuffer {
    fn drop(&mut self) {
        // SAFETY: mapped in `copy_from` with this length, unmapped once.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

#[cfg(test)]
mod tests;
