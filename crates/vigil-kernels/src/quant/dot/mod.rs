//! Dot products of one weight row with one activation row, for every weight format, and the
//! per-element arithmetic contract every path follows.
//!
//! Quantized formats (Q4_0, Q4_1, Q8_0 with 32-value blocks; Q4_K, Q5_K, Q6_K with 256-value
//! super-blocks) compute, per block, an exact integer dot product of the weight and activation
//! quants, then fold it into an f32 sum in block order with the formulas below
//! (`acc_*`). Integer arithmetic is exact and the float operations are the same IEEE operations
//! in the same order on every path, so the scalar path (`scalar`), the AVX2 kernels (`avx2`,
//! `avx2_gemm`, `avx2_gemm_q8`, `avx2_k`, `avx2_k_decode`) and the VNNI kernels (`vnni`: the AVX2 row tiles
//! and k-quant kernels compiled with 256-bit `vpdpbusd` / `vpdpwssd`; `vnni_gemm`: the
//! AVX-VNNI GEMM; `avx512_gemm`: the 16-row AVX-512 VNNI GEMM; `amx_gemm`: the same GEMM
//! with its blocks' integer dots on AMX tiles) give bit-identical results,
//! and a result does not depend on which tile shape, ISA or thread computed it. The integer
//! steps differ (`maddubs` + `madd` through i16, `vpdpbusd` straight to i32, offsets such as
//! Q4_0's `-8 · Σy` applied first or last) but each kernel keeps every intermediate in range,
//! so each gives the same exact block sums. The repacked GEMM kernels share their loop
//! (`gemm_driver`); the k-quant ones (`avx2_kgemm`, `avx512_kgemm`, for Q4_K and Q6_K) their
//! weight layout too (`kgemm_pack`).
//!
//! Float formats (F32, F16, BF16) are reduced differently per path: the scalar path sums in
//! order; the AVX2 path keeps 8 FMA lanes over chunks of 8, sums the lanes with a fixed tree
//! (`avx2_float::hsum8`), then adds the tail in order. Within a path the order per element is
//! fixed; across paths results agree to float rounding (tests use 1e-5 of Σ|w·x|).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod amx_gemm;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx2_float;
#[cfg(target_arch = "x86_64")]
pub mod avx2_float_gemm;
#[cfg(target_arch = "x86_64")]
pub mod avx2_gemm;
#[cfg(target_arch = "x86_64")]
pub mod avx2_gemm_q8;
#[cfg(target_arch = "x86_64")]
pub mod avx2_k;
#[cfg(target_arch = "x86_64")]
pub mod avx2_k_decode;
#[cfg(target_arch = "x86_64")]
pub mod avx2_kgemm;
#[cfg(target_arch = "x86_64")]
pub mod avx2_q4_decode;
#[cfg(target_arch = "x86_64")]
pub mod avx2_q4k_decode;
#[cfg(target_arch = "x86_64")]
pub mod avx2_q8_decode;
#[cfg(target_arch = "x86_64")]
pub mod avx512_bf16;
#[cfg(target_arch = "x86_64")]
pub mod avx512_float;
#[cfg(target_arch = "x86_64")]
pub mod avx512_float_gemm;
#[cfg(target_arch = "x86_64")]
pub mod avx512_gemm;
#[cfg(target_arch = "x86_64")]
pub mod avx512_kgemm;
#[cfg(target_arch = "x86_64")]
pub mod gemm_driver;
#[cfg(target_arch = "x86_64")]
pub mod kgemm_pack;
#[cfg(target_arch = "x86_64")]
pub mod vnni;
#[cfg(target_arch = "x86_64")]
pub mod vnni_gemm;

/// Q4_0 / Q8_0 weights × Q8_0 activations: `sum += sumi * (dx * dy)`.
#[inline(always)]
pub fn acc_q8(sum: f32, sumi: i32, dx: f32, dy: f32) -> f32 {
    sum + sumi as f32 * (dx * dy)
}

/// Q4_1 weights × Q8_1 activations: `sum += sumi * (dx * dy) + mx * sy`.
#[inline(always)]
pub fn acc_q4_1(sum: f32, sumi: i32, dx: f32, dy: f32, mx: f32, sy: f32) -> f32 {
    sum + (sumi as f32 * (dx * dy) + mx * sy)
}

/// Q4_K / Q5_K × Q8_K: `sum += (dx * dy) * sumi - (dminx * dy) * summ`, where `sumi` is the
/// scale-weighted quant dot and `summ` the min-weighted activation sums.
#[inline(always)]
pub fn acc_k(sum: f32, sumi: i32, summ: i32, dx: f32, dmin: f32, dy: f32) -> f32 {
    sum + ((dx * dy) * sumi as f32 - (dmin * dy) * summ as f32)
}

/// Q6_K × Q8_K: `sum += (dx * dy) * sumi`.
#[inline(always)]
pub fn acc_q6k(sum: f32, sumi: i32, dx: f32, dy: f32) -> f32 {
    sum + (dx * dy) * sumi as f32
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K super-block (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `Σ_j mins[j] * (bsums[2j] + bsums[2j+1])`: the activation sums the Q4_K/Q5_K mins scale.
#[inline(always)]
pub fn k_min_sum(mins: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    (0..8)
        .map(|j| mins[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

/// All 8 scales and mins of a Q4_K / Q5_K super-block.
#[inline(always)]
pub fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}

/// Quantized activations for the 32-value formats as the tiles read them: `m` rows of `nb`
/// blocks, plus each block's scale (and Q8_1 sum, Q8_0 offset) as f32/i32 laid out
/// `[block][row]` so a tile loads its rows' values with one vector load.
pub struct Acts32<'a, A> {
    pub blocks: &'a [A],
    pub d: &'a [f32],
    pub s: &'a [f32],
    /// Q8_0: `-8 · Σy` of the block's quants, the Q4_0 offset (its quants are stored +8) as
    /// a kernel adds it to the integer dot with no shift in its loop; 16 times it is the
    /// `-128 · Σy` of the kernels that take weights as `w + 128`.
    pub neg8_ysum: &'a [i32],
    pub m: usize,
    pub nb: usize,
}
