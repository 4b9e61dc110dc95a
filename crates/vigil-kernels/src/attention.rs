//! Paged causal attention over a flat batch: every query row of every sequence attends to its
//! own sequence's keys, read from fixed-size KV blocks through its block table.
//!
//! KV layout per layer: row `slot = block_id * block_size + offset`, each row `kv_heads ×
//! head_dim` values. A query's reduction order depends only on its position and its keys, so
//! the result is the same alone, chunked or batched (the determinism contract).

use crate::pool::{SyncPtr, ThreadPool};
use half::f16;
use std::cell::RefCell;

/// A KV cache element type.
pub trait KvElem: Copy + Send + Sync + Default + 'static {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// `a · b` as the AVX2 attention path computes a score: one FMA per element in order
    /// from 0. Callers check `cpu::features()` and `len % 8 == 0`.
    fn dot_avx2(a: &[f32], b: &[Self]) -> f32;
    /// `out += w * v` with AVX2+FMA(+F16C); same preconditions.
    fn axpy_avx2(out: &mut [f32], w: f32, v: &[Self]);
    /// `out[j * d + c] = cache[rows[j] + c]` as f32 (exact) with AVX2+F16C; `d % 8 == 0`.
    fn widen_rows_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32]);
    /// The same rows transposed: `out[c * ks + j] = cache[rows[j] + c]`, and 0 for
    /// `rows.len() <= j < ks`; `d % 8 == 0`, `ks % 8 == 0`.
    fn widen_t_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32], ks: usize);
}

impl KvElem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn dot_avx2(a: &[f32], b: &[Self]) -> f32 {
        // SAFETY: the caller checked the CPU features; lengths are checked inside.
        unsafe { simd::dot_f32(a, b) }
    }
    fn axpy_avx2(out: &mut [f32], w: f32, v: &[Self]) {
        // SAFETY: as above.
        unsafe { simd::axpy_f32(out, w, v) }
    }
    fn widen_rows_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32]) {
        // SAFETY: as above.
        unsafe { simd::widen_rows(cache, rows, d, out) }
    }
    fn widen_t_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32], ks: usize) {
        // SAFETY: as above.
        unsafe { simd::widen_t(cache, rows, d, out, ks) }
    }
}

impl KvElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn dot_avx2(a: &[f32], b: &[Self]) -> f32 {
        // SAFETY: the caller checked the CPU features; lengths are checked inside.
        unsafe { simd::dot_f16(a, b) }
    }
    fn axpy_avx2(out: &mut [f32], w: f32, v: &[Self]) {
        // SAFETY: as above.
        unsafe { simd::axpy_f16(out, w, v) }
    }
    fn widen_rows_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32]) {
        // SAFETY: as above.
        unsafe { simd::widen_rows(cache, rows, d, out) }
    }
    fn widen_t_avx2(cache: &[Self], rows: &[usize], d: usize, out: &mut [f32], ks: usize) {
        // SAFETY: as above.
        unsafe { simd::widen_t(cache, rows, d, out, ks) }
    }
}

/// AVX2 inner loops of attention: 8 lanes, one fixed reduction order.
#[cfg(target_arch = "x86_64")]
mod simd {
    // Index loops mirror the register tiles.
    #![allow(clippy::needless_range_loop)]
    use crate::vector_math::avx2::exp8;
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// One FMA per element in order from 0: a lane of `scores_t`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        assert!(b.len() >= a.len() && a.len().is_multiple_of(8));
        a.iter()
            .zip(b)
            .fold(0.0, |acc, (&x, y)| x.mul_add(y.to_f32(), acc))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
        assert!(v.len() >= out.len() && out.len().is_multiple_of(8));
        let wv = _mm256_set1_ps(w);
        for i in (0..out.len()).step_by(8) {
            let o = out.as_mut_ptr().add(i);
            let y = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
            _mm256_storeu_ps(o, _mm256_fmadd_ps(wv, y, _mm256_loadu_ps(o)));
        }
    }

    /// KV elements read 8 at a time as f32.
    pub trait Load8: Copy {
        unsafe fn load8(p: *const Self) -> __m256;
    }

    impl Load8 for f32 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
    }

    impl Load8 for f16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(p: *const f16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen_rows<E: Load8>(cache: &[E], rows: &[usize], d: usize, out: &mut [f32]) {
        assert!(d.is_multiple_of(8) && out.len() >= rows.len() * d);
        for (j, &r) in rows.iter().enumerate() {
            assert!(r + d <= cache.len());
            let (s, o) = (cache.as_ptr().add(r), out.as_mut_ptr().add(j * d));
            for c in (0..d).step_by(8) {
                _mm256_storeu_ps(o.add(c), E::load8(s.add(c)));
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen_t<E: Load8>(
        cache: &[E],
        rows: &[usize],
        d: usize,
        out: &mut [f32],
        ks: usize,
    ) {
        assert!(d.is_multiple_of(8) && ks.is_multiple_of(8));
        assert!(rows.len() <= ks && out.len() >= d * ks);
        assert!(rows.iter().all(|&r| r + d <= cache.len()));
        let o = out.as_mut_ptr();
        for j0 in (0..ks).step_by(8) {
            let n = rows.len().saturating_sub(j0).min(8);
            let src: [*const E; 8] =
                std::array::from_fn(|i| cache.as_ptr().add(if i < n { rows[j0 + i] } else { 0 }));
            for c in (0..d).step_by(8) {
                let r: [__m256; 8] = if n == 8 {
                    std::array::from_fn(|i| E::load8(src[i].add(c)))
                } else {
                    std::array::from_fn(|i| {
                        if i < n {
                            E::load8(src[i].add(c))
                        } else {
                            _mm256_setzero_ps()
                        }
                    })
                };
                let t = transpose8(&r);
                for i in 0..8 {
                    _mm256_storeu_ps(o.add((c + i) * ks + j0), t[i]);
                }
            }
        }
    }

    /// Row `i` of the result is column `i` of `r`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn transpose8(r: &[__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        // u_i: columns i | i + 4 of rows 0..4 (of rows 4..8 for u_{i+4}).
        let u = [
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xEE>(t0, t2),
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xEE>(t1, t3),
            _mm256_shuffle_ps::<0x44>(t4, t6),
            _mm256_shuffle_ps::<0xEE>(t4, t6),
            _mm256_shuffle_ps::<0x44>(t5, t7),
            _mm256_shuffle_ps::<0xEE>(t5, t7),
        ];
        std::array::from_fn(|i| {
            if i < 4 {
                _mm256_permute2f128_ps::<0x20>(u[i], u[i + 4])
            } else {
                _mm256_permute2f128_ps::<0x31>(u[i - 4], u[i])
            }
        })
    }

    /// Softmax in place: the max, then `exp8(x - max)` summed in 8 lanes (`hsum`), then
    /// scaled by the sum's reciprocal. Depends only on `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax(x: &mut [f32]) {
        let n = x.len();
        if n == 0 {
            return;
        }
        let full = n / 8 * 8;
        let p = x.as_mut_ptr();
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(8) {
            mv = _mm256_max_ps(mv, _mm256_loadu_ps(p.add(i)));
        }
        let mut m = f32::NEG_INFINITY;
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
        for &v in lanes.iter().chain(&x[full..]) {
            m = m.max(v);
        }
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
            _mm256_storeu_ps(p.add(i), e);
            sum = _mm256_add_ps(sum, e);
        }
        if full < n {
            // The tail padded with the max; padding lanes are zeroed before the sum.
            let mut t = [m; 8];
            t[..n - full].copy_from_slice(&x[full..]);
            let valid = _mm256_cmpgt_epi32(
                _mm256_set1_epi32((n - full) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            let e = _mm256_and_ps(
                exp8(_mm256_sub_ps(_mm256_loadu_ps(t.as_ptr()), mv)),
                _mm256_castsi256_ps(valid),
            );
            _mm256_storeu_ps(t.as_mut_ptr(), e);
            x[full..].copy_from_slice(&t[..n - full]);
            sum = _mm256_add_ps(sum, e);
        }
        let inv = _mm256_set1_ps(1.0 / hsum(sum));
        for i in (0..full).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        }
        let inv = 1.0 / hsum(sum);
        for v in &mut x[full..] {
            *v *= inv;
        }
    }

    /// Scores of queries `q` against the first `n` of a block of `KEYS` keys stored d-major
    /// in `kt` (`kt[c * KEYS + j]`): `out[i][j] = (Σ_c q[i][c] · kt[c][j]) * scale`, each sum
    /// one FMA per `c` in order from 0 in one lane (`KvElem::dot_avx2`), whatever the other
    /// queries. Writes `n` rounded up to 32 keys per query.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores_t<const KEYS: usize>(
        q: &[*const f32],
        kt: &[f32],
        n: usize,
        d: usize,
        scale: f32,
        out: &[*mut f32],
    ) {
        assert!(KEYS.is_multiple_of(32) && kt.len() >= d * KEYS && q.len() == out.len());
        assert!(n <= KEYS);
        let n = n.next_multiple_of(32);
        let kt = kt.as_ptr();
        let mut i0 = 0;
        while i0 < q.len() {
            let last = |i: usize| (i0 + i).min(q.len() - 1);
            let qs: [*const f32; 6] = std::array::from_fn(|i| q[last(i)]);
            let os: [*mut f32; 6] = std::array::from_fn(|i| out[last(i)]);
            // Enough independent accumulators to cover the FMA latency: 4 vectors of keys
            // for 1–2 queries, 2 for 3–6.
            match q.len() - i0 {
                1 => scores_micro::<KEYS, 1, 4>(&qs, kt, n, d, scale, &os),
                2 => scores_micro::<KEYS, 2, 4>(&qs, kt, n, d, scale, &os),
                3 => scores_micro::<KEYS, 3, 2>(&qs, kt, n, d, scale, &os),
                4 => scores_micro::<KEYS, 4, 2>(&qs, kt, n, d, scale, &os),
                5 => scores_micro::<KEYS, 5, 2>(&qs, kt, n, d, scale, &os),
                _ => scores_micro::<KEYS, 6, 2>(&qs, kt, n, d, scale, &os),
            }
            i0 += 6;
        }
    }

    /// `scores_t` for `NQ` queries and keys `0..n` (`n % (8 * KW) == 0`), `KW` vectors of 8
    /// keys at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_micro<const KEYS: usize, const NQ: usize, const KW: usize>(
        q: &[*const f32; 6],
        kt: *const f32,
        n: usize,
        d: usize,
        scale: f32,
        out: &[*mut f32; 6],
    ) {
        let sv = _mm256_set1_ps(scale);
        for j0 in (0..n).step_by(8 * KW) {
            let mut acc = [[_mm256_setzero_ps(); KW]; NQ];
            let mut k = kt.add(j0);
            for c in 0..d {
                let kv: [__m256; KW] = std::array::from_fn(|w| _mm256_loadu_ps(k.add(8 * w)));
                for i in 0..NQ {
                    let x = _mm256_broadcast_ss(&*q[i].add(c));
                    for w in 0..KW {
                        acc[i][w] = _mm256_fmadd_ps(x, kv[w], acc[i][w]);
                    }
                }
                k = k.add(KEYS);
            }
            for i in 0..NQ {
                for w in 0..KW {
                    _mm256_storeu_ps(out[i].add(j0 + 8 * w), _mm256_mul_ps(acc[i][w], sv));
                }
            }
        }
    }

    /// `out[i] += Σ_{j < n[i]} w[i][j] * v[j]` for up to 6 queries over f32 rows of `d` in
    /// `v`: each output element one FMA per key in key order (`KvElem::axpy_avx2`), held in
    /// registers across the keys, whatever the other queries.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sums(
        out: &[*mut f32],
        w: &[*const f32],
        n: &[usize],
        v: &[f32],
        d: usize,
    ) {
        let nq = out.len();
        assert!(d.is_multiple_of(8) && w.len() == nq && n.len() == nq);
        assert!(v.len() >= n.iter().copied().max().unwrap_or(0) * d);
        let v = v.as_ptr();
        let mut i0 = 0;
        while i0 < nq {
            let last = |i: usize| (i0 + i).min(nq - 1);
            let os: [*mut f32; 6] = std::array::from_fn(|i| out[last(i)]);
            let ws: [*const f32; 6] = std::array::from_fn(|i| w[last(i)]);
            let ns: [usize; 6] = std::array::from_fn(|i| n[last(i)]);
            match nq - i0 {
                1 => weighted_sums_group::<1>(&os, &ws, &ns, v, d),
                2 => weighted_sums_group::<2>(&os, &ws, &ns, v, d),
                3 => weighted_sums_group::<3>(&os, &ws, &ns, v, d),
                4 => weighted_sums_group::<4>(&os, &ws, &ns, v, d),
                5 => weighted_sums_group::<5>(&os, &ws, &ns, v, d),
                _ => weighted_sums_group::<6>(&os, &ws, &ns, v, d),
            }
            i0 += 6;
        }
    }

    /// `weighted_sums` for `NQ` queries: slices of the output as wide as the registers allow.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sums_group<const NQ: usize>(
        out: &[*mut f32; 6],
        w: &[*const f32; 6],
        n: &[usize; 6],
        v: *const f32,
        d: usize,
    ) {
        let mut s = 0;
        let wide = if NQ == 1 {
            8
        } else if NQ == 2 {
            4
        } else {
            2
        };
        while s + 8 * wide <= d {
            match wide {
                8 => weighted_sums_slice::<NQ, 8>(out, w, n, v, d, s),
                4 => weighted_sums_slice::<NQ, 4>(out, w, n, v, d, s),
                _ => weighted_sums_slice::<NQ, 2>(out, w, n, v, d, s),
            }
            s += 8 * wide;
        }
        while s < d {
            weighted_sums_slice::<NQ, 1>(out, w, n, v, d, s);
            s += 8;
        }
    }

    /// Output elements `s..s + 8 * C` of `NQ` queries: the keys all of them take together,
    /// then each query's remaining keys.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sums_slice<const NQ: usize, const C: usize>(
        out: &[*mut f32; 6],
        w: &[*const f32; 6],
        n: &[usize; 6],
        v: *const f32,
        d: usize,
        s: usize,
    ) {
        let mut acc: [[__m256; C]; NQ] = std::array::from_fn(|i| {
            std::array::from_fn(|c| _mm256_loadu_ps(out[i].add(s + 8 * c)))
        });
        let common = n[..NQ].iter().copied().min().unwrap_or(0);
        let v = v.add(s);
        for j in 0..common {
            let y: [__m256; C] = std::array::from_fn(|c| _mm256_loadu_ps(v.add(j * d + 8 * c)));
            for i in 0..NQ {
                let wv = _mm256_broadcast_ss(&*w[i].add(j));
                for c in 0..C {
                    acc[i][c] = _mm256_fmadd_ps(wv, y[c], acc[i][c]);
                }
            }
        }
        for i in 0..NQ {
            for j in common..n[i] {
                let wv = _mm256_broadcast_ss(&*w[i].add(j));
                for c in 0..C {
                    let y = _mm256_loadu_ps(v.add(j * d + 8 * c));
                    acc[i][c] = _mm256_fmadd_ps(wv, y, acc[i][c]);
                }
            }
        }
        for i in 0..NQ {
            for c in 0..C {
                _mm256_storeu_ps(out[i].add(s + 8 * c), acc[i][c]);
            }
        }
    }

    /// As `dot_f16`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        assert!(b.len() >= a.len() && a.len().is_multiple_of(8));
        a.iter().zip(b).fold(0.0, |acc, (&x, &y)| x.mul_add(y, acc))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f32(out: &mut [f32], w: f32, v: &[f32]) {
        assert!(v.len() >= out.len() && out.len().is_multiple_of(8));
        let wv = _mm256_set1_ps(w);
        for i in (0..out.len()).step_by(8) {
            let o = out.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                o,
                _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.as_ptr().add(i)), _mm256_loadu_ps(o)),
            );
        }
    }
}

/// Non-x86 builds never take the SIMD path (`cpu::features()` says no); these keep it compiling.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    #![allow(clippy::needless_range_loop)]
    use half::f16;
    pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
    }
    pub unsafe fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
        out.iter_mut()
            .zip(v)
            .for_each(|(o, y)| *o += w * y.to_f32())
    }
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    pub unsafe fn axpy_f32(out: &mut [f32], w: f32, v: &[f32]) {
        out.iter_mut().zip(v).for_each(|(o, y)| *o += w * y)
    }
    pub unsafe fn widen_rows<E: crate::attention::KvElem>(
        cache: &[E],
        rows: &[usize],
        d: usize,
        out: &mut [f32],
    ) {
        for (j, &r) in rows.iter().enumerate() {
            for c in 0..d {
                out[j * d + c] = cache[r + c].to_f32();
            }
        }
    }
    pub unsafe fn widen_t<E: crate::attention::KvElem>(
        cache: &[E],
        rows: &[usize],
        d: usize,
        out: &mut [f32],
        ks: usize,
    ) {
        for j in 0..ks {
            for c in 0..d {
                out[c * ks + j] = rows.get(j).map_or(0.0, |&r| cache[r + c].to_f32());
            }
        }
    }
    pub unsafe fn softmax(x: &mut [f32]) {
        crate::ops::softmax_inplace(x)
    }
    pub unsafe fn scores_t<const KEYS: usize>(
        q: &[*const f32],
        kt: &[f32],
        n: usize,
        d: usize,
        scale: f32,
        out: &[*mut f32],
    ) {
        for (&qi, &oi) in q.iter().zip(out) {
            for j in 0..n {
                let mut acc = 0f32;
                for c in 0..d {
                    acc = (*qi.add(c)).mul_add(kt[c * KEYS + j], acc);
                }
                *oi.add(j) = acc * scale;
            }
        }
    }
    pub unsafe fn weighted_sums(
        out: &[*mut f32],
        w: &[*const f32],
        n: &[usize],
        v: &[f32],
        d: usize,
    ) {
        for i in 0..out.len() {
            let o = std::slice::from_raw_parts_mut(out[i], d);
            for j in 0..n[i] {
                axpy_f32(o, *w[i].add(j), &v[j * d..(j + 1) * d]);
            }
        }
    }
}

/// One sequence's part of the batch: query rows `query_start..query_start+query_len`, which are
/// the last `query_len` of its `context_len` tokens.
#[derive(Debug, Clone, Copy)]
pub struct AttnSeq<'a> {
    pub query_start: usize,
    pub query_len: usize,
    pub context_len: usize,
    pub block_table: &'a [u32],
}

/// Shapes of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Sliding-window (local) attention: a query at position `t` attends to keys
    /// `t + 1 - window ..= t` only (Gemma 3's local layers, llama.cpp's standard SWA). `None`:
    /// every earlier key.
    pub window: Option<usize>,
}

/// Write K and V rows of the new tokens into their cache slots.
pub fn write_kv<E: KvElem>(
    k_cache: &mut [E],
    v_cache: &mut [E],
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    kv_dim: usize,
) {
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let dst = slot as usize * kv_dim;
        for (d, s) in k_cache[dst..dst + kv_dim]
            .iter_mut()
            .zip(&k[t * kv_dim..(t + 1) * kv_dim])
        {
            *d = E::from_f32(*s);
        }
        for (d, s) in v_cache[dst..dst + kv_dim]
            .iter_mut()
            .zip(&v[t * kv_dim..(t + 1) * kv_dim])
        {
            *d = E::from_f32(*s);
        }
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t][h] = softmax(q[t][h] · K[first(t)..=pos(t)] / sqrt(d)) · V` for every query row `t`
/// and head `h`, where `first(t)` is 0, or the window's first key (`AttnShape::window`).
pub fn paged_attention<E: KvElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    seqs: &[AttnSeq],
    out: &mut [f32],
) {
    let q_dim = shape.num_heads * shape.head_dim;
    debug_assert_eq!(
        q.len(),
        seqs.iter().map(|s| s.query_len).sum::<usize>() * q_dim
    );
    let group = shape.num_heads / shape.num_kv_heads;
    // A tile is up to ROWS_PER_TILE query rows of one sequence × the heads sharing one KV head:
    // each key and value block is widened (K also transposed) once for all of them. Only when
    // there are fewer such tiles than threads (a decode step of one sequence with one KV head)
    // are the heads split into separate tiles, since that repeats the widening per head.
    let mut tiles = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.query_len).step_by(ROWS_PER_TILE) {
            tiles.push((si, r0, (r0 + ROWS_PER_TILE).min(s.query_len)));
        }
    }
    let heads_per_tile = if tiles.len() * shape.num_kv_heads >= pool.num_threads() {
        group
    } else {
        1
    };
    let head_tiles = shape.num_heads / heads_per_tile;
    let out_ptr = SyncPtr::new(out);
    // Later rows of a prefill attend to more keys; the pool splits tasks into contiguous
    // chunks, so alternate light and heavy tiles to give each chunk a similar share.
    let n_tiles = tiles.len();
    let tile_of = |i: usize| {
        if i.is_multiple_of(2) {
            i / 2
        } else {
            n_tiles - 1 - i / 2
        }
    };
    pool.run(n_tiles * head_tiles, |task| {
        let (si, r0, r1) = tiles[tile_of(task / head_tiles)];
        let h0 = task % head_tiles * heads_per_tile;
        let seq = &seqs[si];
        let tile = Tile {
            seq,
            rows: seq.query_start + r0..seq.query_start + r1,
            heads: h0..h0 + heads_per_tile,
        };
        // SAFETY: tiles cover disjoint (row, head) ranges of `out`.
        attend_tile(shape, &tile, q, k_cache, v_cache, |row, head| unsafe {
            out_ptr.slice(row * q_dim + head * shape.head_dim, shape.head_dim)
        });
    });
}

/// Query rows handled together: each K and V block is widened once for rows × group queries;
/// 8 keeps a tile's scores (24 rows of keys for a group of 3) within L2 at 2K context.
const ROWS_PER_TILE: usize = 8;

/// Flat query rows of one sequence and the heads (all sharing one KV head) of one task.
struct Tile<'a, 'b> {
    seq: &'a AttnSeq<'b>,
    rows: std::ops::Range<usize>,
    heads: std::ops::Range<usize>,
}

/// Where a tile's queries and keys are: sizes, and each row's keys in the paged cache.
struct TileGeometry<'a> {
    d: usize,
    q_dim: usize,
    kv_dim: usize,
    kv_head: usize,
    block_size: usize,
    scale: f32,
    first_pos: usize,
    query_start: usize,
    /// Keys of the tile's last row: the most any row attends to.
    max_keys: usize,
    window: Option<usize>,
    block_table: &'a [u32],
}

impl<'a> TileGeometry<'a> {
    fn new(shape: AttnShape, tile: &Tile<'_, 'a>) -> Self {
        let d = shape.head_dim;
        let seq = tile.seq;
        let first_pos = seq.context_len - seq.query_len;
        TileGeometry {
            d,
            q_dim: shape.num_heads * d,
            kv_dim: shape.num_kv_heads * d,
            kv_head: tile.heads.start / (shape.num_heads / shape.num_kv_heads),
            block_size: shape.block_size,
            scale: 1.0 / (d as f32).sqrt(),
            first_pos,
            query_start: seq.query_start,
            max_keys: first_pos + (tile.rows.end - 1 - seq.query_start) + 1,
            window: shape.window,
            block_table: seq.block_table,
        }
    }

    /// Row `row` attends to keys `first_key(row)..num_keys(row)` (up to its position).
    fn num_keys(&self, row: usize) -> usize {
        self.first_pos + (row - self.query_start) + 1
    }

    /// The first key row `row` attends to: 0, or its window's first.
    fn first_key(&self, row: usize) -> usize {
        self.window
            .map_or(0, |w| self.num_keys(row).saturating_sub(w))
    }

    /// Offset of key `p`'s row for this tile's KV head.
    fn key_row(&self, p: usize) -> usize {
        let slot =
            self.block_table[p / self.block_size] as usize * self.block_size + p % self.block_size;
        slot * self.kv_dim + self.kv_head * self.d
    }

    /// `key_row` of keys `p0..p1` into `out`, one table lookup per cache block.
    fn key_rows(&self, p0: usize, p1: usize, out: &mut Vec<usize>) {
        out.clear();
        let mut p = p0;
        while p < p1 {
            let end = ((p / self.block_size + 1) * self.block_size).min(p1);
            let first = self.key_row(p);
            out.extend((0..end - p).map(|i| first + i * self.kv_dim));
            p = end;
        }
    }
}

/// Scores, softmax and weighted values for every (row, head) of a tile. Each query's dot
/// products, softmax and value sum run in key order with the same operations whatever the
/// tile, so a query's output never depends on which other queries share its tile.
fn attend_tile<'o, E: KvElem>(
    shape: AttnShape,
    tile: &Tile,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    out_for: impl Fn(usize, usize) -> &'o mut [f32],
) {
    let g = TileGeometry::new(shape, tile);
    let (d, q_dim, scale, max_keys) = (g.d, g.q_dim, g.scale, g.max_keys);
    let key_row = |p| g.key_row(p);
    let keys = |row| g.first_key(row)..g.num_keys(row);
    let simd = crate::cpu::features().avx2_fma_f16c && d.is_multiple_of(8);
    let queries: Vec<(usize, usize)> = tile
        .rows
        .clone()
        .flat_map(|r| tile.heads.clone().map(move |h| (r, h)))
        .collect();
    if simd {
        return attend_tile_simd(shape, tile, q, k_cache, v_cache, &queries, out_for);
    }
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.resize(queries.len() * max_keys, 0.0);
        for p in g.first_key(tile.rows.start)..max_keys {
            let k = &k_cache[key_row(p)..][..d];
            for (qi, &(row, head)) in queries.iter().enumerate() {
                if keys(row).contains(&p) {
                    let qv = &q[row * q_dim + head * d..][..d];
                    scores[qi * max_keys + p] = dot_f32_kv(qv, k) * scale;
                }
            }
        }
        for (qi, &(row, _)) in queries.iter().enumerate() {
            let r = keys(row);
            crate::ops::softmax_inplace(
                &mut scores[qi * max_keys + r.start..qi * max_keys + r.end],
            );
        }
        let mut outs: Vec<&mut [f32]> = queries
            .iter()
            .map(|&(row, head)| out_for(row, head))
            .collect();
        outs.iter_mut().for_each(|o| o.fill(0.0));
        for p in g.first_key(tile.rows.start)..max_keys {
            let v = &v_cache[key_row(p)..][..d];
            for (qi, &(row, _)) in queries.iter().enumerate() {
                if keys(row).contains(&p) {
                    let w = scores[qi * max_keys + p];
                    for (o, &x) in outs[qi].iter_mut().zip(v) {
                        *o += w * x.to_f32();
                    }
                }
            }
        }
    });
}

/// The softmax of the attention path this CPU takes: the AVX2 one (vector `exp`, 8-lane
/// sum) when available, else `ops::softmax_inplace`. Public so tests can rebuild a query's
/// output from the per-key operations.
pub fn softmax_dispatched(x: &mut [f32]) {
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the features were just checked.
        unsafe { simd::softmax(x) }
    } else {
        crate::ops::softmax_inplace(x)
    }
}

/// Keys converted to f32 at once per tile: this many rows of K or V.
const KEY_BLOCK: usize = 64;

thread_local! {
    static KV_BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The AVX2 path of `attend_tile`: per query the operations of `KvElem::dot_avx2` per key,
/// the vectorized softmax (`softmax_dispatched`), then `KvElem::axpy_avx2` per key in order
/// (so the same bits alone or in any tile). Each block of `KEY_BLOCK` K rows is widened to
/// f32 and transposed once for the whole tile, so the scores are a register-tiled product
/// (queries × keys, one lane per score, no horizontal sums); each V block is widened once
/// and several queries' outputs stay in registers across its keys.
#[allow(clippy::too_many_arguments)]
fn attend_tile_simd<'o, E: KvElem>(
    shape: AttnShape,
    tile: &Tile,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    queries: &[(usize, usize)],
    out_for: impl Fn(usize, usize) -> &'o mut [f32],
) {
    let g = TileGeometry::new(shape, tile);
    let (d, q_dim, scale, max_keys) = (g.d, g.q_dim, g.scale, g.max_keys);
    let num_keys = |row| g.num_keys(row);
    let first_key = |row| g.first_key(row);
    // The tile's keys start at its first row's window (0 without one); a later row's keys
    // before its own window get weight 0 (adding 0 · v leaves a sum as it is).
    let start = first_key(tile.rows.start);
    let nq = queries.len();
    // Score rows padded to whole key blocks: the kernels write a block's keys for every query.
    let stride = start + (max_keys - start).next_multiple_of(KEY_BLOCK);
    let q_ptrs: Vec<*const f32> = queries
        .iter()
        .map(|&(row, head)| q[row * q_dim + head * d..][..d].as_ptr())
        .collect();
    let mut rows = Vec::with_capacity(KEY_BLOCK);
    let mut ptrs: Vec<*mut f32> = Vec::with_capacity(nq);
    let mut weights: Vec<*const f32> = Vec::with_capacity(nq);
    let mut counts: Vec<usize> = Vec::with_capacity(nq);
    SCORES.with(|cell| {
        KV_BLOCK.with(|kv_cell| {
            let mut scores = cell.borrow_mut();
            let mut buf = kv_cell.borrow_mut();
            // Every score a softmax reads is written first, so no clearing.
            if scores.len() < nq * stride {
                scores.resize(nq * stride, 0.0);
            }
            buf.resize(KEY_BLOCK * d, 0.0);
            let base = scores.as_mut_ptr();
            for p0 in (start..max_keys).step_by(KEY_BLOCK) {
                let p1 = (p0 + KEY_BLOCK).min(max_keys);
                g.key_rows(p0, p1, &mut rows);
                E::widen_t_avx2(k_cache, &rows, d, &mut buf, KEY_BLOCK);
                ptrs.clear();
                // SAFETY: each query's block of scores lies inside its padded row.
                ptrs.extend((0..nq).map(|qi| unsafe { base.add(qi * stride + p0) }));
                // SAFETY: `simd` was checked by the caller; `q_ptrs` rows have `d` elements;
                // the other lengths are checked inside.
                unsafe { simd::scores_t::<KEY_BLOCK>(&q_ptrs, &buf, p1 - p0, d, scale, &ptrs) };
            }
            for (qi, &(row, _)) in queries.iter().enumerate() {
                let first = first_key(row);
                let s = &mut scores[qi * stride..qi * stride + num_keys(row)];
                s[start..first].fill(0.0);
                // SAFETY: as above.
                unsafe { simd::softmax(&mut s[first..]) };
            }
            let mut outs: Vec<&mut [f32]> = queries
                .iter()
                .map(|&(row, head)| out_for(row, head))
                .collect();
            outs.iter_mut().for_each(|o| o.fill(0.0));
            ptrs.clear();
            ptrs.extend(outs.iter_mut().map(|o| o.as_mut_ptr()));
            for p0 in (start..max_keys).step_by(KEY_BLOCK) {
                let p1 = (p0 + KEY_BLOCK).min(max_keys);
                g.key_rows(p0, p1, &mut rows);
                E::widen_rows_avx2(v_cache, &rows, d, &mut buf);
                counts.clear();
                counts.extend(
                    queries
                        .iter()
                        .map(|&(row, _)| num_keys(row).min(p1).saturating_sub(p0)),
                );
                weights.clear();
                weights.extend((0..nq).map(|qi| scores[qi * stride + p0..].as_ptr()));
                // SAFETY: as above; each output has `d` elements, each weight row `counts`.
                unsafe { simd::weighted_sums(&ptrs, &weights, &counts, &buf, d) };
            }
        })
    });
}

fn dot_f32_kv<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    // Eight partial sums in a fixed order: vectorizes, and the order never depends on the batch.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l].to_f32();
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len() {
        sum += a[i] * b[i].to_f32();
    }
    sum
}
