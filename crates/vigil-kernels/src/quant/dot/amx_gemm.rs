//! AMX prefill GEMM for Q8_0 weights: each block's integer dots of 16 activation rows × 16
//! weight rows in one tile instruction, folded into f32 exactly as `avx512_gemm` folds them,
//! so every output has the scalar path's bits.
//!
//! A group's packed block is `avx512_gemm`'s (`Packed16Q8`, same packing): its quant vector
//! `h` holds, in i32 lane `n`, the 4 quants of weight row `n` that meet activation bytes
//! `4h..4h + 4`. That is the layout AMX wants for the B operand of a `K = 32` dot (row `h` =
//! the 4-byte groups of every column), so a block's 8 vectors load as one 8 × 64-byte tile.
//! The A operand is the 16 activation rows' 32 quants of the block, copied side by side once
//! per 128-row chunk (`ATile`: 8 aligned lines; read in place, each row's 32 bytes sit an
//! activation row apart and often straddle two lines: the layer 5-10 % slower).
//!
//! Per block, `tdpbssd` gives each (activation row, weight row) pair its exact integer dot in
//! a 16 × 16 i32 tile (the same integer the VNNI chains reach from `-128 · Σy`); the tile is
//! stored and each row folded with `super::acc_q8` per lane in block order, as
//! `avx512_gemm::tile_q8` does, so the float operations and their order are unchanged: only
//! the integer step moved.
//!
//! The fold needs the tile in memory, and a store followed at once by its reload sets the
//! pace, so blocks alternate between two tile sets and each block's dots are stored one block
//! before they are folded: block `b + 1`'s store and block `b + 2`'s dot overlap block `b`'s
//! fold (8-16 % faster than storing each block just before its fold).
//!
//! What it gains (Emerald Rapids, 2 threads, `docs/results/amx-q8-xeon-1206i`), before that
//! overlap: the Qwen3-0.6B shape's layer at 512 rows ×1.31–1.36 (`matmul_bench 512 2 10
//! q8_0x8`), its Q8_0 pp512 ×1.09–1.24. Four blocks' dots at once were no faster. Q4 on the
//! same scheme (`tdpbsud` on the unsigned nibbles) was level for Q4_0 and 4-9 % faster for
//! Q4_1 on SmolLM2's layer, so Q4 stays on `avx512_gemm`.
//!
//! Tiles of fewer than 16 activation rows (a chunk's last rows) run `avx512_gemm`'s tile.
//! Tile instructions are written as inline assembly (Rust's AMX intrinsics are unstable); the
//! tile configuration is loaded at each call's start and released at its end, so a thread
//! holds the tile state only while it multiplies. The process asks the kernel for the tile
//! state once (`cpu::amx_int8`).

// Index loops mirror the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_gemm_q8::Q8Group;
use super::avx512_gemm::{self, Packed16Q8};
use super::gemm_driver::with_buffer;
use super::Acts32;
use crate::quant::blocks::BlockQ8_0;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Activation rows per tile: a tile register's 16 rows.
const MR: usize = 16;

/// The tile configuration (palette 1), two sets of three tiles: tmm0 and tmm3, the i32 dots
/// (16 rows × 16 lanes); tmm1 and tmm6, the activations (16 rows × 32 bytes); tmm2 and tmm7,
/// the weights (8 rows × 64 bytes). tmm4 and tmm5 are unused.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

static CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    // Bytes per row of tmm0..tmm7 (u16 each from byte 16), then rows (u8 each from byte 48).
    let colsb: [u16; 8] = [64, 32, 64, 64, 0, 0, 32, 64];
    let rows: [u8; 8] = [16, 16, 8, 16, 0, 0, 16, 8];
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = colsb[t] as u8;
        c[17 + 2 * t] = (colsb[t] >> 8) as u8;
        c[48 + t] = rows[t];
        t += 1;
    }
    TileConfig(c)
};

/// One block's 16 × 16 integer dots, stored row by row.
#[repr(C, align(64))]
struct Dots([[i32; 16]; 16]);

/// Start one block's integer dots in tile set `P` (0: tmm0 from tmm1 × tmm2; 1: tmm3 from
/// tmm6 × tmm7): `Σ_k a_i[k] · w_n[k]` over the block's 32 quants, the A tile `a` (16 rows of
/// 32 bytes) against the packed weights `w` (8 rows of 64 bytes), all signed bytes.
///
/// # Safety
/// The tile configuration is loaded (`CONFIG`); `a` addresses 512 bytes, `w` 512.
#[inline(always)]
unsafe fn start<const P: usize>(a: *const i8, w: *const u8) {
    macro_rules! dot {
        ($c:literal, $x:literal, $y:literal) => {
            asm!(
                concat!("tilezero ", $c),
                concat!("tileloadd ", $x, ", [{a} + {sa}*1]"),
                concat!("tileloadd ", $y, ", [{w} + {sw}*1]"),
                concat!("tdpbssd ", $c, ", ", $x, ", ", $y),
                a = in(reg) a,
                sa = in(reg) 32usize,
                w = in(reg) w,
                sw = in(reg) 64usize,
                options(nostack, readonly, preserves_flags),
            )
        };
    }
    if P == 0 {
        dot!("tmm0", "tmm1", "tmm2");
    } else {
        dot!("tmm3", "tmm6", "tmm7");
    }
}

/// Store tile set `P`'s dots, row by row.
///
/// # Safety
/// The tile configuration is loaded and `start::<P>` ran since the last store of `P`.
#[inline(always)]
unsafe fn store<const P: usize>(dots: &mut Dots) {
    macro_rules! store {
        ($c:literal) => {
            asm!(
                concat!("tilestored [{d} + {s}*1], ", $c),
                d = in(reg) dots.0.as_mut_ptr(),
                s = in(reg) 64usize,
                options(nostack, preserves_flags),
            )
        };
    }
    if P == 0 {
        store!("tmm0");
    } else {
        store!("tmm3");
    }
}

/// Activation rows per pass over a thread's weight groups (as `gemm_driver`'s): their A
/// tiles stay in L2 while each group's packed blocks serve them all from L1.
const ROW_CHUNK: usize = 128;

/// One block's quants of 16 activation rows, side by side: an A tile in 8 aligned lines (read
/// in place, the rows' 32 bytes sit one activation row apart and often straddle two lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct ATile([[i8; 32]; 16]);

thread_local! {
    static A_TILES: RefCell<Vec<ATile>> = const { RefCell::new(Vec::new()) };
}

/// Copy the quants of activation rows `i0..i0 + tiles * MR` into `out`: tile `t`, block `b`
/// at `out[t * nb + b]`.
fn pack_acts(acts: &Acts32<BlockQ8_0>, i0: usize, tiles: usize, out: &mut Vec<ATile>) {
    let nb = acts.nb;
    out.clear();
    out.reserve(tiles * nb);
    for t in 0..tiles {
        let rows = &acts.blocks[(i0 + t * MR) * nb..(i0 + (t + 1) * MR) * nb];
        for b in 0..nb {
            out.push(ATile(std::array::from_fn(|i| rows[i * nb + b].qs)));
        }
    }
}

/// The `MR × 16` outputs of activation rows `i0..i0 + MR` (their A tiles `a`, one a block)
/// against one packed group.
///
/// # Safety
/// AVX-512 F/BW and the tile configuration loaded; `pk` and `a` hold `acts.nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_q8(
    pk: &[Packed16Q8],
    a: &[ATile],
    acts: &Acts32<BlockQ8_0>,
    i0: usize,
) -> [__m512; MR] {
    let (m, nb) = (acts.m, acts.nb);
    let mut dots = [Dots([[0; 16]; 16]), Dots([[0; 16]; 16])];
    let mut acc = [_mm512_setzero_ps(); MR];
    let ab = |b: usize| a.as_ptr().add(b).cast::<i8>();
    let wb = |b: usize| pk[b].qs.as_ptr().cast::<u8>();
    // Block b's dots run in tile set b % 2 and are stored a block before they are folded.
    start::<0>(ab(0), wb(0));
    if nb > 1 {
        start::<1>(ab(1), wb(1));
    }
    store::<0>(&mut dots[0]);
    let mut fold = |b: usize, d: &Dots| {
        let p = &*pk.as_ptr().add(b);
        let side = b * m + i0;
        let dx = _mm512_load_ps(p.d.as_ptr());
        for i in 0..MR {
            // super::acc_q8 per lane, as avx512_gemm::tile_q8.
            let sumi = _mm512_load_si512(d.0[i].as_ptr().cast());
            let dy = _mm512_set1_ps(*acts.d.get_unchecked(side + i));
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dx, dy));
            acc[i] = _mm512_add_ps(acc[i], t);
        }
    };
    // Block `b` in tile set `P`: its dots are in `dots[P]`, block `b + 1`'s run in set `Q`.
    macro_rules! block {
        ($b:expr, $p:literal, $q:literal) => {{
            let b = $b;
            if b + 2 < nb {
                start::<$p>(ab(b + 2), wb(b + 2));
            }
            fold(b, &dots[$p]);
            if b + 1 < nb {
                store::<$q>(&mut dots[$q]);
            }
        }};
    }
    for b in (0..nb).step_by(2) {
        block!(b, 0, 1);
        if b + 1 < nb {
            block!(b + 1, 1, 0);
        }
    }
    acc
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, 16 weight
/// rows a group and 16 activation rows a tile (a chunk's last rows one at a time on
/// `avx512_gemm`'s tile); `S` is `avx2::Q8_0` or `X8<avx2::Q8_0>`.
///
/// # Safety
/// AVX2+FMA+F16C, AVX-512 F/BW/VL/VNNI and AMX-TILE/INT8 available with the tile state
/// granted (`cpu::amx_int8`); `w` holds `rows * nb` blocks; `out` addresses `m * rows` floats
/// and no other thread writes columns `r0..r1`; the activation side arrays are filled.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn matmul_rows<S: Q8Group>(
    w: &[S::W],
    rows: usize,
    acts: &Acts32<BlockQ8_0>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly, preserves_flags));
    let (m, nb) = (acts.m, acts.nb);
    A_TILES.with(|cell| {
        let mut own = Vec::new();
        let mut shared = cell.try_borrow_mut();
        // Re-entered on this thread (not expected): a private buffer.
        let a = match shared.as_deref_mut() {
            Ok(a) => a,
            Err(_) => &mut own,
        };
        with_buffer(nb, |pk: &mut [Packed16Q8]| {
            for c0 in (0..m).step_by(ROW_CHUNK) {
                let c1 = (c0 + ROW_CHUNK).min(m);
                let tiles = (c1 - c0) / MR;
                pack_acts(acts, c0, tiles, a);
                for j0 in (r0..r1).step_by(16) {
                    let n = (r1 - j0).min(16);
                    avx512_gemm::pack_q8::<S>(w, nb, j0, r1, pk);
                    for t in 0..tiles {
                        let i0 = c0 + t * MR;
                        let acc = tile_q8(pk, &a[t * nb..(t + 1) * nb], acts, i0);
                        for (i, v) in acc.into_iter().enumerate() {
                            avx512_gemm::store16(out.add((i0 + i) * rows + j0), v, n);
                        }
                    }
                    for i0 in c0 + tiles * MR..c1 {
                        let [v] = avx512_gemm::tile_q8::<1>(pk, acts, i0);
                        avx512_gemm::store16(out.add(i0 * rows + j0), v, n);
                    }
                }
            }
        });
    });
    asm!("tilerelease", options(nostack, nomem, preserves_flags));
}
