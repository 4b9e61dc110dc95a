//! One KV tensor's memory: a zeroed, page-aligned anonymous mapping that the OS backs with
//! pages only where it is written, and whose pages can be given back (`release`) when nothing
//! will read their rows again (the blocks every sliding-window layer has slid past). A given
//! back page reads as zeros and is mapped afresh by its next write. A mapping of 2 MiB or
//! more asks for transparent huge pages, unless its pages are given back (`keep_small_pages`).
//!
//! Why a mapping whose pages are given back must not ask for huge pages: khugepaged collapses
//! any 2 MiB range of a huge-page mapping with as few as one page present (its default
//! `max_ptes_none` is 511) into a huge page, which maps every page of the range again, the
//! given-back ones included. So does a mapping smaller than 2 MiB that the kernel merged with a
//! neighbouring one that asked. Those ask for small pages instead.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, Range};

use memmap2::MmapMut;

/// The size of a transparent huge page on x86-64 (and arm64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

/// `len` elements of `E` in their own anonymous mapping (see the module docs).
pub struct KvBuf<E> {
    /// `None` for an empty buffer (a zero-length mapping is an error on some systems).
    map: Option<MmapMut>,
    len: usize,
    _elem: PhantomData<E>,
}

impl<E: bytemuck::Pod> KvBuf<E> {
    /// `len` zeros. Nothing is resident until written.
    pub fn zeroed(len: usize) -> Self {
        let bytes = len
            .checked_mul(size_of::<E>())
            .unwrap_or_else(|| panic!("KV buffer of {len} elements overflows"));
        let map = (bytes > 0).then(|| {
            let map = MmapMut::map_anon(bytes)
                .unwrap_or_else(|e| panic!("cannot map {bytes} bytes for the KV cache: {e}"));
            // Transparent huge pages where the kernel gives them on request (THP "madvise";
            // "always" needs no hint): a decode step reads each KV head's 2 KiB pieces
            // across the whole context, and with 4 KiB pages nearly every piece is a TLB miss
            // (SmolLM2's attention after 2,048 tokens: ~11 % less time, `attention_bench`
            // with `HUGE=1`). Memory is still taken as rows are written, 2 MiB at a time. A
            // mapping that cannot hold one asks for small pages (see the module docs).
            #[cfg(target_os = "linux")]
            let _ = map.advise(if bytes >= HUGE_PAGE {
                memmap2::Advice::HugePage
            } else {
                memmap2::Advice::NoHugePage
            });
            map
        });
        KvBuf {
            map,
            len,
            _elem: PhantomData,
        }
    }

    /// Ask for small pages from now on (Linux; elsewhere a no-op): for a buffer whose pages
    /// `release` gives back, so that khugepaged does not map them again (see the module docs).
    /// Pages already in a huge page are split as they are given back.
    pub fn keep_small_pages(&self) {
        #[cfg(target_os = "linux")]
        if let Some(map) = &self.map {
            let _ = map.advise(memmap2::Advice::NoHugePage);
        }
    }

    /// Map every page of the buffer now, as writes would, without changing what it holds
    /// (Linux 5.14 on: `MADV_POPULATE_WRITE`). A server does this once at start, as
    /// llama-server clears its KV and vLLM allocates its own: otherwise the first write to
    /// each fresh page faults in the middle of a request, and the block pool hands out every
    /// never-used block before it reuses one. Returns the bytes mapped; 0 where the OS cannot
    /// (pages then still come with their first write).
    pub fn prefault(&self) -> usize {
        #[cfg(target_os = "linux")]
        if let Some(map) = &self.map {
            if map.advise(memmap2::Advice::PopulateWrite).is_ok() {
                return map.len();
            }
        }
        0
    }

    /// Give back the pages lying wholly inside `elems` (a partial page at either end stays:
    /// it may hold rows still in use). Their contents read as zeros afterwards. Returns the
    /// bytes given back; 0 where the OS cannot (then the rows simply stay).
    pub fn release(&mut self, elems: Range<usize>) -> usize {
        let (Some(map), Some(page)) = (self.map.as_ref(), page_size()) else {
            return 0;
        };
        let end = elems.end.min(self.len) * size_of::<E>();
        let start = (elems.start * size_of::<E>()).next_multiple_of(page);
        let end = end / page * page;
        if start >= end {
            return 0;
        }
        release_range(map, start, end - start)
    }

    /// Bytes of this buffer the OS holds in memory now (`mincore`); `None` where unknown.
    pub fn resident_bytes(&self) -> Option<usize> {
        match self.map.as_ref() {
            None => Some(0),
            Some(map) => resident(map),
        }
    }
}

#[cfg(unix)]
pub(crate) fn page_size() -> Option<usize> {
    // SAFETY: `sysconf` only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s.is_power_of_two())
}

#[cfg(not(unix))]
pub(crate) fn page_size() -> Option<usize> {
    None
}

#[cfg(unix)]
fn release_range(map: &MmapMut, offset: usize, len: usize) -> usize {
    // SAFETY: no reference into these pages outlives this call (the buffer is borrowed
    // mutably by `release`), and `MADV_DONTNEED` on a private anonymous mapping only swaps
    // the pages for zero-fill ones, which every later access sees.
    let done =
        unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    if done.is_ok() {
        len
    } else {
        0
    }
}

#[cfg(not(unix))]
fn release_range(_: &MmapMut, _: usize, _: usize) -> usize {
    0
}

#[cfg(target_os = "linux")]
fn resident(map: &MmapMut) -> Option<usize> {
    let page = page_size()?;
    let mut pages = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the mapping is page-aligned and `pages` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), pages.as_mut_ptr()) };
    (rc == 0).then(|| pages.iter().filter(|&&p| p & 1 != 0).count() * page)
}

#[cfg(not(target_os = "linux"))]
fn resident(_: &MmapMut) -> Option<usize> {
    None
}

impl<E: bytemuck::Pod> Deref for KvBuf<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        match &self.map {
            Some(map) => &bytemuck::cast_slice(map)[..self.len],
            None => &[],
        }
    }
}

impl<E: bytemuck::Pod> DerefMut for KvBuf<E> {
    fn deref_mut(&mut self) -> &mut [E] {
        let len = self.len;
        match &mut self.map {
            Some(map) => &mut bytemuck::cast_slice_mut(map)[..len],
            None => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_pages_read_as_zeros_and_partial_pages_stay() {
        let Some(page) = page_size() else { return };
        let per_page = page / 4;
        let mut b = KvBuf::<f32>::zeroed(per_page * 4);
        b.iter_mut().for_each(|x| *x = 1.0);
        // From mid page 0 to mid page 3: pages 1 and 2 go.
        let gone = b.release(per_page / 2..3 * per_page + 1);
        assert_eq!(gone, 2 * page);
        // (Before reading them: a read maps the zero page, which `mincore` counts.)
        if let Some(r) = b.resident_bytes() {
            assert_eq!(r, 2 * page);
        }
        assert!(b[..per_page].iter().all(|&x| x == 1.0));
        assert!(b[per_page..3 * per_page].iter().all(|&x| x == 0.0));
        assert!(b[3 * per_page..].iter().all(|&x| x == 1.0));
        b[per_page] = 2.0;
        assert_eq!(b[per_page], 2.0);
        assert_eq!(b.release(0..per_page - 1), 0);
        assert!(KvBuf::<f32>::zeroed(0).is_empty());
    }

    /// A prefault maps every page and keeps what was written (it may run beside writes).
    #[cfg(target_os = "linux")]
    #[test]
    fn prefault_maps_every_page_and_keeps_rows() {
        let Some(page) = page_size() else { return };
        let per_page = page / 4;
        let mut b = KvBuf::<f32>::zeroed(per_page * 8);
        b[per_page * 3] = 7.0;
        assert_eq!(b.resident_bytes(), Some(page));
        // Kernels before 5.14 refuse the advice; the buffer then stays lazy.
        if b.prefault() == 0 {
            eprintln!("MADV_POPULATE_WRITE unsupported here: the prefault test did not run");
            return;
        }
        assert_eq!(b.resident_bytes(), Some(8 * page));
        assert_eq!(b[per_page * 3], 7.0);
        assert_eq!(b.iter().filter(|&&x| x != 0.0).count(), 1);
        assert_eq!(KvBuf::<f32>::zeroed(0).prefault(), 0);
    }

    /// What khugepaged does in the background, done now: `MADV_COLLAPSE` (Linux 6.1 on) makes
    /// every 2 MiB range of the buffer one huge page where the mapping allows it. Whether it
    /// did.
    #[cfg(target_os = "linux")]
    fn collapse(b: &KvBuf<f32>) -> bool {
        const MADV_COLLAPSE: libc::c_int = 25;
        let Some(map) = b.map.as_ref() else {
            return false;
        };
        // SAFETY: advice on this buffer's own mapping; a collapse keeps every page's contents.
        unsafe { libc::madvise(map.as_ptr() as *mut _, map.len(), MADV_COLLAPSE) == 0 }
    }

    /// 8 MiB of `f32` (whole 2 MiB ranges inside, wherever the mapping starts), every page
    /// written, then every other run of 16 pages given back, as a sliding window gives back
    /// old blocks beside newer ones: each 2 MiB range keeps half its pages. The bytes left.
    #[cfg(target_os = "linux")]
    fn half_given_back(b: &mut KvBuf<f32>, page: usize) -> usize {
        let per_page = page / 4;
        for p in 0..b.len() / per_page {
            b[p * per_page] = 1.0;
        }
        let run = 16 * per_page;
        let given: usize = (0..b.len() / run)
            .step_by(2)
            .map(|r| b.release(r * run..(r + 1) * run))
            .sum();
        b.len() * 4 - given
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn given_back_pages_stay_given_back_when_huge_pages_are_collapsed() {
        let Some(page) = page_size() else { return };
        let mut b = KvBuf::<f32>::zeroed((8 << 20) / 4);
        b.keep_small_pages();
        let left = half_given_back(&mut b, page);
        assert_eq!(b.resident_bytes(), Some(left));
        collapse(&b);
        assert_eq!(
            b.resident_bytes(),
            Some(left),
            "given-back pages mapped again"
        );
    }

    /// The same without `keep_small_pages`: where the kernel collapses, the given-back pages
    /// come back (the reason for it). Where it cannot (no THP, an older kernel), it says so.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_huge_page_mapping_refills_given_back_pages_when_collapsed() {
        let Some(page) = page_size() else { return };
        let mut b = KvBuf::<f32>::zeroed((8 << 20) / 4);
        let left = half_given_back(&mut b, page);
        if !collapse(&b) {
            eprintln!("skipped: this kernel does not collapse huge pages on request");
            return;
        }
        let resident = b.resident_bytes().unwrap_or(0);
        assert!(
            resident > left,
            "{resident} bytes resident after a collapse, {left} before"
        );
        let run = 16 * page / 4;
        assert!(
            b[..run].iter().all(|&x| x == 0.0),
            "given-back rows read as zeros"
        );
    }

    #[test]
    fn small_buffers_ask_for_small_pages() {
        // Below 2 MiB a buffer cannot hold a huge page of its own; merged with a neighbour
        // that asked for them, it could be collapsed all the same. Its pages stay as written.
        let Some(page) = page_size() else { return };
        let per_page = page / 4;
        let mut b = KvBuf::<f32>::zeroed(per_page * 64);
        b[0] = 1.0;
        #[cfg(target_os = "linux")]
        let _ = collapse(&b);
        if let Some(r) = b.resident_bytes() {
            assert_eq!(r, page);
        }
    }
}
