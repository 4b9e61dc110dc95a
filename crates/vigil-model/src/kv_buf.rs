//! One KV tensor's memory: a zeroed, page-aligned anonymous mapping that the OS backs with
//! pages only where it is written, and whose pages can be given back (`release`) when nothing
//! will read their rows again (the blocks every sliding-window layer has slid past). A given
//! back page reads as zeros and is mapped afresh by its next write. The mapping asks for
//! transparent huge pages.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, Range};

use memmap2::MmapMut;

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
            // with `HUGE=1`). Memory is still taken as rows are written, 2 MiB at a time.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            map
        });
        KvBuf {
            map,
            len,
            _elem: PhantomData,
        }
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
}
