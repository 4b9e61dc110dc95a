//! The loop every repacked-weight GEMM kernel shares (`avx2_gemm`, `avx2_gemm_q8`,
//! `vnni_gemm`, `avx512_gemm`): over chunks of activation rows, groups of `NR` weight rows
//! repacked into a per-thread L1-resident buffer, and register tiles of `MR` activation rows.
//!
//! A kernel is a `Repacked` type: how a group is packed and how a tile is multiplied against
//! it. `drive` is `#[inline(always)]` and has no target features of its own, so each ISA's
//! `#[target_feature]` entry point gets its own copy compiled for that ISA, with the kernel's
//! tile inlined into it (see `with_buffer` for how).

// Index loops mirror the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::Acts32;
use std::cell::RefCell;

/// Activation rows per pass over a thread's weight groups: their quantized blocks stay in L2
/// (128 rows of 1536 values: 221 KB) while each group's packed buffer (a few hundred bytes a
/// block) serves them all from L1, so each group is repacked once per 128 rows. (64 rows:
/// every kernel 5–10% slower at m = 512; 256 rows: no faster than 128.)
const ROW_CHUNK: usize = 128;

/// 64 aligned bytes: the unit of the per-thread buffer every kernel's packed blocks live in.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

thread_local! {
    static PACKED: RefCell<Vec<Align64>> = const { RefCell::new(Vec::new()) };
}

/// A repacked-weight micro-kernel as `drive` runs it: how a group of `NR` weight rows is
/// packed, and how a tile of activation rows is multiplied against the packed group.
pub trait Repacked {
    type W;
    type A;
    /// One block of `NR` weight rows: plain numbers (any bits valid), aligned to at most 64.
    type Packed: Copy;
    /// One tile row's `NR` outputs in a register (`__m256` or `__m512`).
    type Lanes: Copy;
    /// Weight rows per group (the split between threads is aligned to it by the caller).
    const NR: usize;
    /// Repack weight rows `j0..j0 + NR` (rows `>= r1` repeat row `r1 - 1`; their outputs are
    /// dropped) into `out[..nb]`.
    ///
    /// # Safety
    /// The kernel's target features; `w` holds at least `r1 * nb` blocks; `j0 < r1`.
    unsafe fn pack(w: &[Self::W], nb: usize, j0: usize, r1: usize, out: &mut [Self::Packed]);
    /// The `R × NR` outputs of activation rows `i0..i0 + R` against one packed group, lane
    /// `k` of result `i` being weight row `k` of the group.
    ///
    /// # Safety
    /// The kernel's target features; `pk` holds `nb` blocks; `acts` covers rows
    /// `i0..i0 + R`.
    unsafe fn tile<const R: usize>(
        pk: &[Self::Packed],
        acts: &Acts32<Self::A>,
        i0: usize,
    ) -> [Self::Lanes; R];
    /// Write the first `n <= NR` lanes of `v` to `dst[..n]`.
    ///
    /// # Safety
    /// The kernel's target features; `dst` addresses `n` floats.
    unsafe fn store(dst: *mut f32, v: Self::Lanes, n: usize);
}

/// Run `f` on this thread's packing buffer, grown to `nb` blocks of `P`.
///
/// Entry points call it with a closure that calls `drive`: a closure inherits its enclosing
/// function's target features, so `drive` and the kernel's tile are inlined into it and
/// compiled for the entry point's ISA. (A closure inside `drive` itself would inherit none:
/// its tile calls, and every intrinsic of an `#[inline(always)]` tile, would stay calls.)
///
/// # Safety
/// Any bits are a valid `P` (plain numbers).
#[inline(always)]
pub unsafe fn with_buffer<P: Copy, T>(nb: usize, f: impl FnOnce(&mut [P]) -> T) -> T {
    const {
        assert!(std::mem::align_of::<P>() <= 64);
        assert!(std::mem::size_of::<P>().is_multiple_of(std::mem::align_of::<P>()));
    }
    let units = (nb * std::mem::size_of::<P>()).div_ceil(64);
    let slice = |buf: &mut Vec<Align64>| {
        if buf.len() < units {
            buf.resize(units, Align64([0; 64]));
        }
        // SAFETY: the buffer is 64-byte aligned and holds `nb` blocks' bytes, and any bits
        // are a valid `P`.
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<P>(), nb) }
    };
    PACKED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => f(slice(&mut buf)),
        // Re-entered on this thread (not expected): use a private buffer.
        Err(_) => f(slice(&mut Vec::new())),
    })
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, in tiles of
/// `MR` activation rows (the rest in a tile of 4 where `MR` is larger, then one row at a time),
/// with `pk` (`nb` blocks, from `with_buffer`) as the packing buffer.
///
/// Call it only inside a `#[target_feature]` function (or a closure in one) enabling
/// everything `K` needs, so that it and `K`'s tile are compiled (and inlined) for that ISA.
///
/// # Safety
/// `K`'s target features available; `w` holds `rows * nb` blocks; `out` addresses `m * rows`
/// floats and no other thread writes columns `r0..r1`; the activation side arrays are filled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn drive<K: Repacked, const MR: usize>(
    pk: &mut [K::Packed],
    w: &[K::W],
    rows: usize,
    acts: &Acts32<K::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let (m, nb) = (acts.m, acts.nb);
    for c0 in (0..m).step_by(ROW_CHUNK) {
        let c1 = (c0 + ROW_CHUNK).min(m);
        let full = c0 + (c1 - c0) / MR * MR;
        for j0 in (r0..r1).step_by(K::NR) {
            let n = (r1 - j0).min(K::NR);
            K::pack(w, nb, j0, r1, pk);
            for i0 in (c0..full).step_by(MR) {
                let acc = K::tile::<MR>(pk, acts, i0);
                for i in 0..MR {
                    K::store(out.add((i0 + i) * rows + j0), acc[i], n);
                }
            }
            // The rest: 4 rows together where they fit, then one at a time. (One at a time, a
            // kernel that unpacks its weights as it goes unpacks them once a row: 4 rows of
            // Q4_K took 0.138-0.140 ms a Gemma 3 layer on AVX-512, 0.106-0.109 together.)
            let mut i0 = full;
            if MR > 4 && c1 - i0 >= 4 {
                let acc = K::tile::<4>(pk, acts, i0);
                for i in 0..4 {
                    K::store(out.add((i0 + i) * rows + j0), acc[i], n);
                }
                i0 += 4;
            }
            for i0 in i0..c1 {
                let [acc] = K::tile::<1>(pk, acts, i0);
                K::store(out.add(i0 * rows + j0), acc, n);
            }
        }
    }
}
