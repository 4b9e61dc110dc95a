//! The 256-bit VNNI instructions in their two encodings, and the entry points that compile
//! the AVX2 row tiles (`avx2`: decode and the rows a GEMM leaves) and the k-quant kernels
//! (`avx2_k`) with them.
//!
//! `vpdpbusd` (u8 × i8, sums of 4 into i32) and `vpdpwssd` (i16 × i16, sums of 2 into i32)
//! exist as AVX-VNNI (VEX, `avxvnni`: Alder Lake, Zen 5, ...) and as AVX512-VNNI + VL (EVEX:
//! every AVX-512 VNNI CPU). Both give the same exact i32 sums as AVX2's `maddubs` + `madd`
//! (the kernels keep every i16 pair sum in range, so AVX2 never saturates), so the kernels are
//! written once against `IntDot` / `Vnni256` and every path gives the scalar path's bits.
//!
//! The entry points are `#[target_feature]` functions whose bodies are the `#[inline(always)]`
//! generic kernels, so each is compiled with its encoding's instructions inline.

use super::avx2::{self, Fmt32, IntDot};
use super::avx2_k_decode::{self, KDecode};
use super::avx2_q4_decode::{self, GroupTiles};
use super::Acts32;
use crate::quant::blocks::BlockQ8K;
use std::arch::x86_64::*;

/// A 256-bit VNNI encoding.
pub trait Vnni256 {
    /// `acc + Σ_4 u8(u) · i8(s)` per i32 lane.
    ///
    /// # Safety
    /// The encoding's features (inlined into an entry point that enables them).
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc + Σ_2 i16(a) · i16(b)` per i32 lane.
    ///
    /// # Safety
    /// As `dpbusd`.
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `dpwssd`, emitted as the one instruction it is. Given the intrinsic, LLVM may split it
    /// into `vpmaddwd` + `vpaddd`, two uops where the k-quant decode tile is bound by them: its
    /// Q4_K blocks ran 55 GFLOP/s on one thread split, 62–65 whole (`matmul_bench 1 1 2000
    /// q4_k`, AVX-512 Xeon).
    ///
    /// # Safety
    /// As `dpwssd`.
    unsafe fn dpwssd_whole(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

/// `vpdpwssd` in inline assembly, with `{vex}` for the AVX-VNNI encoding.
macro_rules! dpwssd_asm {
    ($prefix:literal, $acc:ident, $a:ident, $b:ident) => {{
        let mut acc = $acc;
        std::arch::asm!(
            concat!($prefix, "vpdpwssd {acc}, {a}, {b}"),
            acc = inout(ymm_reg) acc,
            a = in(ymm_reg) $a,
            b = in(ymm_reg) $b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }};
}

/// # Safety
/// AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dpwssd_vex(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    dpwssd_asm!("{{vex}} ", acc, a, b)
}

/// # Safety
/// AVX512-VNNI and VL.
#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
unsafe fn dpwssd_evex(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    dpwssd_asm!("", acc, a, b)
}

/// The VEX encoding (`avxvnni`).
pub enum AvxVnni {}
/// The EVEX encoding (`avx512vnni` + `avx512vl`).
pub enum Avx512Vl {}

impl Vnni256 for AvxVnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dpwssd_whole(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        dpwssd_vex(acc, a, b)
    }
}

impl Vnni256 for Avx512Vl {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dpwssd_whole(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        dpwssd_evex(acc, a, b)
    }
}

impl<V: Vnni256> IntDot for V {
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i {
        V::dpbusd(_mm256_setzero_si256(), u, s)
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        V::dpwssd(acc, a, b)
    }
    #[inline(always)]
    unsafe fn madd_acc_whole(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        V::dpwssd_whole(acc, a, b)
    }
    #[inline(always)]
    unsafe fn dot4_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        V::dpbusd(acc, u, s)
    }
    /// Two chains, so that decode's one activation row is not bound by the latency.
    #[inline(always)]
    unsafe fn dot4_sum8(u: &[__m256i; 8], s: &[__m256i; 8]) -> __m256i {
        let mut c = [
            V::dpbusd(_mm256_setzero_si256(), u[0], s[0]),
            V::dpbusd(_mm256_setzero_si256(), u[1], s[1]),
        ];
        for k in 2..8 {
            c[k % 2] = V::dpbusd(c[k % 2], u[k], s[k]);
        }
        _mm256_add_epi32(c[0], c[1])
    }
}

/// `avx2::matmul_rows` (32-value formats, row tiles) with AVX-VNNI.
///
/// # Safety
/// AVX2+FMA+F16C+AVX-VNNI available; otherwise as `avx2::matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn rows32_avx_vnni<F: Fmt32>(
    w: &[F::W],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2::rows_with::<AvxVnni, F>(w, rows, acts, r0, r1, out)
}

/// `avx2::matmul_rows` (32-value formats, row tiles) with AVX512-VNNI on 256 bits.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI available; otherwise as `avx2::matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows32_avx512vl<F: Fmt32>(
    w: &[F::W],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2::rows_with::<Avx512Vl, F>(w, rows, acts, r0, r1, out)
}

/// `avx2_q4_decode::matmul_rows_x8` (interleaved Q4_0 / Q4_1 / Q8_0 / Q4_K, decode) with
/// AVX-VNNI.
///
/// # Safety
/// AVX2+FMA+F16C+AVX-VNNI available; otherwise as `avx2_q4_decode::matmul_rows_x8`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn rows_x8_avx_vnni<T: GroupTiles>(
    w: &[T::X8],
    rows: usize,
    acts: &Acts32<T::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2_q4_decode::rows_x8_with::<AvxVnni, T>(w, rows, acts, r0, r1, out)
}

/// `avx2_q4_decode::matmul_rows_x8` (interleaved Q4_0 / Q4_1 / Q8_0 / Q4_K, decode) with
/// AVX512-VNNI on 256 bits.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI available; otherwise as
/// `avx2_q4_decode::matmul_rows_x8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_x8_avx512vl<T: GroupTiles>(
    w: &[T::X8],
    rows: usize,
    acts: &Acts32<T::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2_q4_decode::rows_x8_with::<Avx512Vl, T>(w, rows, acts, r0, r1, out)
}

/// `avx2_k_decode::matmul_rows` (the k-quant decode tile) with AVX-VNNI.
///
/// # Safety
/// AVX2+FMA+F16C+AVX-VNNI available; otherwise as `avx2_k_decode::matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn rows_k_decode_avx_vnni<F: KDecode>(
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2_k_decode::rows_with::<AvxVnni, F>(w, rows, acts, m, r0, r1, out)
}

/// `avx2_k_decode::matmul_rows` (the k-quant decode tile) with AVX512-VNNI on 256 bits.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI available; otherwise as
/// `avx2_k_decode::matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_k_decode_avx512vl<F: KDecode>(
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    avx2_k_decode::rows_with::<Avx512Vl, F>(w, rows, acts, m, r0, r1, out)
}
