//! The x86 inner loops of attention: scores, exponentials and weighted value sums over f16 or
//! f32 KV, 8 lanes (AVX2+FMA+F16C) or 16 (AVX-512 F), each in one fixed reduction order.

// Index loops mirror the register tiles.
#![allow(clippy::needless_range_loop)]
use crate::vector_math::avx2::{exp2_8, hmax8, max_lanes8};
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

/// Value rows fetched this many keys ahead. In decode the rows come from DRAM and a key
/// takes a few cycles, so 4 keys ahead hid little of the latency (SmolLM2 decode after
/// 2,048 tokens, with 4-column tiles for 3 queries below: 6.2–7.6 ms a step against
/// 7.0–8.7, prefill unchanged; Zen 3).
const VALUE_PREFETCH: usize = 16;

/// KV elements read 8 (AVX2) or 16 (AVX-512) at a time as f32.
pub trait Load8: Copy {
    unsafe fn load8(p: *const Self) -> __m256;
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Load8 for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Load8 for f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
}

/// `x[i] = exp2_8(x[i] - max)` in place (scores in base-2 units, `AttnShape::score_scale`),
/// summed in 8 lanes (`hsum`): returns the max and the sum. Depends only on `x`
/// (`runs::exp_run_dispatched`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_run(x: &mut [f32]) -> (f32, f32) {
    let n = x.len();
    if n == 0 {
        return (f32::NEG_INFINITY, 0.0);
    }
    let full = n / 8 * 8;
    // The max in four chains, its lanes reduced in registers: one chain and a scalar
    // NaN-checking max over the stored lanes were half of this function's samples, which
    // were 16 % of a 2,048-token prefill's attention (`attention_bench 2048 1 4` held to AVX2:
    // 77-78 ms a layer before, 72-74 after; Emerald Rapids).
    let mv = max_lanes8(x);
    let mut m = hmax8(mv);
    for &v in &x[full..] {
        m = m.max(v);
    }
    (m, hsum(exp_tail(x, 0, m, _mm256_setzero_ps())))
}

/// `sum` plus `exp2_8(x[i] - m)` of `x[from..]`, written back, 8 at a time in order: the
/// tail padded with `m`, its padding lanes zeroed before the sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_tail(x: &mut [f32], from: usize, m: f32, mut sum: __m256) -> __m256 {
    let n = x.len();
    let full = from + (n - from) / 8 * 8;
    let p = x.as_mut_ptr();
    let mv = _mm256_set1_ps(m);
    for i in (from..full).step_by(8) {
        let e = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
        _mm256_storeu_ps(p.add(i), e);
        sum = _mm256_add_ps(sum, e);
    }
    if full < n {
        let mut t = [m; 8];
        t[..n - full].copy_from_slice(&x[full..]);
        let valid = _mm256_cmpgt_epi32(
            _mm256_set1_epi32((n - full) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let e = _mm256_and_ps(
            exp2_8(_mm256_sub_ps(_mm256_loadu_ps(t.as_ptr()), mv)),
            _mm256_castsi256_ps(valid),
        );
        _mm256_storeu_ps(t.as_mut_ptr(), e);
        x[full..].copy_from_slice(&t[..n - full]);
        sum = _mm256_add_ps(sum, e);
    }
    sum
}

/// `exp_run` with the exponentials 16 at a time (`exp2_16`, `exp2_8`'s operations per
/// lane): the same max, the same values, and the sum taken in the same 8 lanes in the same
/// order (each 16 as its low 8, then its high 8), so the same bits. A prefill step's softmax
/// at 2,000 tokens was 16 % of its samples with 8 lanes on this level.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn exp_run16(x: &mut [f32]) -> (f32, f32) {
    use crate::vector_math::avx512::{exp2_16, max_lanes16};
    let n = x.len();
    if n < 16 {
        return exp_run(x);
    }
    let full16 = n / 16 * 16;
    let p = x.as_mut_ptr();
    let mv = max_lanes16(x);
    let mut m = _mm512_reduce_max_ps(mv);
    for &v in &x[full16..] {
        m = m.max(v);
    }
    let mv = _mm512_set1_ps(m);
    let mut sum = _mm256_setzero_ps();
    for i in (0..full16).step_by(16) {
        let e = exp2_16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mv));
        _mm512_storeu_ps(p.add(i), e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        sum = _mm256_add_ps(
            sum,
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
        );
    }
    let sum = exp_tail(x, full16, m, sum);
    (m, hsum(sum))
}

/// Softmax in place (natural units): each `x - max` taken to base 2, `exp_run`, then scaled
/// by the sum's reciprocal.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut()
        .for_each(|v| *v = (*v - max) * std::f32::consts::LOG2_E);
    let (_, sum) = exp_run(x);
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Scores of queries `q` against vectors of 8 keys (16 with `wide`, AVX-512) read from
/// the cache: vector `w`'s element `c` is at `keys[w].0 + c * stride` (keys of one KV head
/// in a block, d-major) and its scores go to `out[i] + keys[w].1`: `(Σ_c q[i][c] · k[c]) *
/// scale`, each sum one FMA per `c` in order from 0 in one lane (`KvElem::dot_avx2`),
/// whatever the other queries or the vector width.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-512 F with `wide`); each `q[i]` readable for `d` floats,
/// each `keys[w].0` for `(d - 1) * stride + L` elements, each `out[i] + keys[w].1`
/// writable for `L` floats (`L` = 8, or 16 with `wide`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores_t<E: Load8>(
    q: &[*const f32],
    keys: &[(*const E, usize)],
    stride: usize,
    d: usize,
    scale: f32,
    out: &[*mut f32],
    wide: bool,
) {
    assert!(q.len() == out.len());
    if keys.is_empty() {
        return;
    }
    for (i0, n) in passes(q.len(), wide) {
        let last = |i: usize| i0 + i.min(n - 1);
        let qs: [*const f32; GROUP_MAX] = std::array::from_fn(|i| q[last(i)]);
        let os: [*mut f32; GROUP_MAX] = std::array::from_fn(|i| out[last(i)]);
        // Enough independent accumulators to cover the FMA latency: 4 vectors of keys
        // for 1–2 queries, 3 for 3 (a decode step's group in SmolLM2: 9 chains instead
        // of 6, ~5 % less time per key with the keys in L2, 7 % at 2,048 keys from DRAM;
        // Zen 3), 2 for 4–6. AVX-512's 32 registers take up to 24 sums: a prefill tile's
        // 16 or 24 queries in passes of 8 or 12, each key vector widened once a pass.
        match (wide, n) {
            (false, 1) => scores_micro::<E, 1, 4>(&qs, keys, stride, d, scale, &os),
            (false, 2) => scores_micro::<E, 2, 4>(&qs, keys, stride, d, scale, &os),
            (false, 3) => scores_micro::<E, 3, 3>(&qs, keys, stride, d, scale, &os),
            (false, 4) => scores_micro::<E, 4, 2>(&qs, keys, stride, d, scale, &os),
            (false, 5) => scores_micro::<E, 5, 2>(&qs, keys, stride, d, scale, &os),
            (false, _) => scores_micro::<E, 6, 2>(&qs, keys, stride, d, scale, &os),
            (true, 1) => scores_micro16::<E, 1, 4>(&qs, keys, stride, d, scale, &os),
            (true, 2) => scores_micro16::<E, 2, 4>(&qs, keys, stride, d, scale, &os),
            (true, 3) => scores_micro16::<E, 3, 2>(&qs, keys, stride, d, scale, &os),
            (true, 4) => scores_micro16::<E, 4, 2>(&qs, keys, stride, d, scale, &os),
            (true, 5) => scores_micro16::<E, 5, 2>(&qs, keys, stride, d, scale, &os),
            (true, 6) => scores_micro16::<E, 6, 2>(&qs, keys, stride, d, scale, &os),
            (true, 7) => scores_micro16::<E, 7, 3>(&qs, keys, stride, d, scale, &os),
            (true, 8) => scores_micro16::<E, 8, 3>(&qs, keys, stride, d, scale, &os),
            (true, 9) => scores_micro16::<E, 9, 2>(&qs, keys, stride, d, scale, &os),
            (true, 10) => scores_micro16::<E, 10, 2>(&qs, keys, stride, d, scale, &os),
            (true, 11) => scores_micro16::<E, 11, 2>(&qs, keys, stride, d, scale, &os),
            (true, _) => scores_micro16::<E, 12, 2>(&qs, keys, stride, d, scale, &os),
        }
    }
}

/// The most queries one register tile serves.
const GROUP_MAX: usize = 12;

/// `n` queries as passes `(first, count)`: with `wide` (AVX-512's 32 registers) at most 12 a
/// pass, of nearly equal size (16 queries are two passes of 8, not 12 and 4); without, 6 a
/// pass and the rest (the AVX2 tiles as tuned on Zen 3).
fn passes(n: usize, wide: bool) -> impl Iterator<Item = (usize, usize)> {
    let size = if wide {
        n.div_ceil(n.div_ceil(GROUP_MAX).max(1))
    } else {
        6
    };
    (0..n)
        .step_by(size.max(1))
        .map(move |i0| (i0, size.min(n - i0)))
}

/// `scores_t` for `NQ` queries, `KW` vectors of keys at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_micro<E: Load8, const NQ: usize, const KW: usize>(
    q: &[*const f32; GROUP_MAX],
    keys: &[(*const E, usize)],
    stride: usize,
    d: usize,
    scale: f32,
    out: &[*mut f32; GROUP_MAX],
) {
    let sv = _mm256_set1_ps(scale);
    for w0 in (0..keys.len()).step_by(KW) {
        // A short last group repeats its last vector: the same scores written twice.
        let group: [(*const E, usize); KW] =
            std::array::from_fn(|w| keys[(w0 + w).min(keys.len() - 1)]);
        // The next group's keys, fetched while this one computes: a block's keys of one
        // KV head are a short run (2 KiB at d 64 and 16-key blocks) that the hardware
        // prefetcher barely ramps up on before the next block's run starts elsewhere.
        let next: [*const E; KW] =
            std::array::from_fn(|w| keys[(w0 + KW + w).min(keys.len() - 1)].0);
        let mut acc = [[_mm256_setzero_ps(); KW]; NQ];
        for c in 0..d {
            for n in next {
                _mm_prefetch::<_MM_HINT_T0>(n.wrapping_add(c * stride).cast());
            }
            let kv: [__m256; KW] = std::array::from_fn(|w| E::load8(group[w].0.add(c * stride)));
            for i in 0..NQ {
                let x = _mm256_broadcast_ss(&*q[i].add(c));
                for w in 0..KW {
                    acc[i][w] = _mm256_fmadd_ps(x, kv[w], acc[i][w]);
                }
            }
        }
        for i in 0..NQ {
            for w in 0..KW {
                _mm256_storeu_ps(out[i].add(group[w].1), _mm256_mul_ps(acc[i][w], sv));
            }
        }
    }
}

/// `scores_micro` with 16-key vectors (AVX-512): each lane the same FMAs in the same
/// order, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn scores_micro16<E: Load8, const NQ: usize, const KW: usize>(
    q: &[*const f32; GROUP_MAX],
    keys: &[(*const E, usize)],
    stride: usize,
    d: usize,
    scale: f32,
    out: &[*mut f32; GROUP_MAX],
) {
    let sv = _mm512_set1_ps(scale);
    for w0 in (0..keys.len()).step_by(KW) {
        let group: [(*const E, usize); KW] =
            std::array::from_fn(|w| keys[(w0 + w).min(keys.len() - 1)]);
        let next: [*const E; KW] =
            std::array::from_fn(|w| keys[(w0 + KW + w).min(keys.len() - 1)].0);
        let mut acc = [[_mm512_setzero_ps(); KW]; NQ];
        for c in 0..d {
            for n in next {
                _mm_prefetch::<_MM_HINT_T0>(n.wrapping_add(c * stride).cast());
            }
            let kv: [__m512; KW] = std::array::from_fn(|w| E::load16(group[w].0.add(c * stride)));
            for i in 0..NQ {
                let x = _mm512_set1_ps(*q[i].add(c));
                for w in 0..KW {
                    acc[i][w] = _mm512_fmadd_ps(x, kv[w], acc[i][w]);
                }
            }
        }
        for i in 0..NQ {
            for w in 0..KW {
                _mm512_storeu_ps(out[i].add(group[w].1), _mm512_mul_ps(acc[i][w], sv));
            }
        }
    }
}

/// `out[i] += Σ_{j < n[i]} w[i][j] * v[rows[j]..][..d]` for up to 6 queries over value
/// rows read from the cache: each output element one FMA per key in key order
/// (`KvElem::axpy_avx2`), held in registers across the keys, whatever the other queries.
///
/// `wide`: 16-lane slices (AVX-512, `d % 16 == 0`), the same operations per element.
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-512 F with `wide`); each `out[i]` writable for `d` floats,
/// each `w[i]` readable for `n[i]` (the other lengths are checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn weighted_sums<E: Load8>(
    out: &[*mut f32],
    w: &[*const f32],
    n: &[usize],
    v: &[E],
    rows: &[usize],
    d: usize,
    wide: bool,
) {
    let nq = out.len();
    assert!(d.is_multiple_of(if wide { 16 } else { 8 }) && w.len() == nq && n.len() == nq);
    let used = n.iter().copied().max().unwrap_or(0);
    assert!(rows.len() >= used);
    // One max over the rows (a loop the compiler vectorizes) instead of a check per row
    // that stops at the first failure: this runs once per (run, head) of every decode step.
    let last = rows[..used].iter().fold(0, |m, &r| m.max(r));
    assert!(used == 0 || last + d <= v.len());
    let v = (v.as_ptr(), rows.as_ptr());
    for (i0, take) in passes(nq, wide) {
        let last = |i: usize| i0 + i.min(take - 1);
        let os: [*mut f32; GROUP_MAX] = std::array::from_fn(|i| out[last(i)]);
        let ws: [*const f32; GROUP_MAX] = std::array::from_fn(|i| w[last(i)]);
        let ns: [usize; GROUP_MAX] = std::array::from_fn(|i| n[last(i)]);
        match take {
            1 => weighted_sums_group::<E, 1>(&os, &ws, &ns, v, d, wide),
            2 => weighted_sums_group::<E, 2>(&os, &ws, &ns, v, d, wide),
            3 => weighted_sums_group::<E, 3>(&os, &ws, &ns, v, d, wide),
            4 => weighted_sums_group::<E, 4>(&os, &ws, &ns, v, d, wide),
            5 => weighted_sums_group::<E, 5>(&os, &ws, &ns, v, d, wide),
            6 => weighted_sums_group::<E, 6>(&os, &ws, &ns, v, d, wide),
            // Only with `wide` (`passes`).
            7 => weighted_sums_group::<E, 7>(&os, &ws, &ns, v, d, wide),
            8 => weighted_sums_group::<E, 8>(&os, &ws, &ns, v, d, wide),
            9 => weighted_sums_group::<E, 9>(&os, &ws, &ns, v, d, wide),
            10 => weighted_sums_group::<E, 10>(&os, &ws, &ns, v, d, wide),
            11 => weighted_sums_group::<E, 11>(&os, &ws, &ns, v, d, wide),
            _ => weighted_sums_group::<E, 12>(&os, &ws, &ns, v, d, wide),
        }
    }
}

/// `$key(&mut $acc, j, prefetch)` for each `j in 0..$common` in order, `prefetch` while row
/// `j + VALUE_PREFETCH` is one of them: two keys a loop iteration while it is, then one at a
/// time. The loop's own instructions were a third of a key's 12 FMAs (2-4 % less attention
/// time in `attention_bench 2048 1 4`, AVX2 and AVX-512 alike). A macro, not a function taking
/// the step as a closure: that made the AVX-512 slice kernel 3-5 % slower (57-59 ms against
/// 55-56).
macro_rules! each_key {
    ($common:expr, $key:ident, $acc:ident) => {{
        let ahead = $common.saturating_sub(VALUE_PREFETCH);
        let mut j = 0;
        while j + 2 <= ahead {
            $key(&mut $acc, j, true);
            $key(&mut $acc, j + 1, true);
            j += 2;
        }
        for j in j..$common {
            $key(&mut $acc, j, j < ahead);
        }
    }};
}

/// `weighted_sums` for `NQ` queries: slices of the output as wide as the registers allow.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sums_group<E: Load8, const NQ: usize>(
    out: &[*mut f32; GROUP_MAX],
    w: &[*const f32; GROUP_MAX],
    n: &[usize; GROUP_MAX],
    v: (*const E, *const usize),
    d: usize,
    avx512: bool,
) {
    // `passes` gives more than 6 queries only to the 16-lane slices.
    debug_assert!(avx512 || NQ <= 6);
    let mut s = 0;
    if avx512 {
        // 16-wide slices; every output element gets the same FMAs in the same order. With
        // 32 registers, 3 queries (a decode step's group in SmolLM2) take 12 sums: a
        // head of 64 in one pass over the keys, 3 % less time a step than two passes of 6.
        // A prefill pass of 7-12 queries takes up to 24: each value vector widened once
        // serves twice the FMAs it did in passes of 6.
        let c = if NQ <= 3 { 4 } else { 2 };
        while s + 16 * c <= d {
            if c == 4 {
                weighted_sums_slice16::<E, NQ, 4>(out, w, n, v, s);
            } else {
                weighted_sums_slice16::<E, NQ, 2>(out, w, n, v, s);
            }
            s += 16 * c;
        }
        while s + 16 <= d {
            weighted_sums_slice16::<E, NQ, 1>(out, w, n, v, s);
            s += 16;
        }
    }
    // Column vectors per pass: as many as the 16 registers hold accumulators for, and
    // at least 8 of them where they fit, since each is a chain of FMAs (4 cycles each)
    // over the keys and two issue a cycle. 3 queries (a decode step's heads of one KV
    // head in SmolLM2) take 3 vectors (9 sums, the 3 value vectors and 3 weights: 15
    // registers), then 2: a head of 64 is passes of 24, 24 and 16 columns. Splitting
    // them as 2 + 1 queries of 32 columns (8 chains, then 4 that wait on their latency)
    // took 5 % more time a decode step's attention with the keys in L2, and 4 × 3
    // spills a sum into its chain.
    let wide = match NQ {
        1 => 8,
        2 => 4,
        3 => 3,
        _ => 2,
    };
    while s + 8 * wide <= d {
        match wide {
            8 => weighted_sums_slice::<E, NQ, 8>(out, w, n, v, s),
            4 => weighted_sums_slice::<E, NQ, 4>(out, w, n, v, s),
            3 => weighted_sums_slice::<E, NQ, 3>(out, w, n, v, s),
            _ => weighted_sums_slice::<E, NQ, 2>(out, w, n, v, s),
        }
        s += 8 * wide;
    }
    if wide > 2 && s + 16 <= d {
        weighted_sums_slice::<E, NQ, 2>(out, w, n, v, s);
        s += 16;
    }
    while s < d {
        weighted_sums_slice::<E, NQ, 1>(out, w, n, v, s);
        s += 8;
    }
}

/// `weighted_sums_slice` for elements `s..s + 16 * C` (AVX-512).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn weighted_sums_slice16<E: Load8, const NQ: usize, const C: usize>(
    out: &[*mut f32; GROUP_MAX],
    w: &[*const f32; GROUP_MAX],
    n: &[usize; GROUP_MAX],
    (v, rows): (*const E, *const usize),
    s: usize,
) {
    let mut acc: [[__m512; C]; NQ] =
        std::array::from_fn(|i| std::array::from_fn(|c| _mm512_loadu_ps(out[i].add(s + 16 * c))));
    let common = n[..NQ].iter().copied().min().unwrap_or(0);
    let v = v.add(s);
    let key = |acc: &mut [[__m512; C]; NQ], j: usize, prefetch: bool| {
        if prefetch {
            let ahead = v.add(*rows.add(j + VALUE_PREFETCH)).cast::<u8>();
            for line in (0..16 * C * size_of::<E>()).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
            }
        }
        let r = v.add(*rows.add(j));
        let y: [__m512; C] = std::array::from_fn(|c| E::load16(r.add(16 * c)));
        for i in 0..NQ {
            let wv = _mm512_set1_ps(*w[i].add(j));
            for c in 0..C {
                acc[i][c] = _mm512_fmadd_ps(wv, y[c], acc[i][c]);
            }
        }
    };
    if NQ > 6 {
        // 24 sums leave too few registers for two keys' values in flight.
        let ahead = common.saturating_sub(VALUE_PREFETCH);
        for j in 0..common {
            key(&mut acc, j, j < ahead);
        }
    } else {
        each_key!(common, key, acc);
    }
    for i in 0..NQ {
        for j in common..n[i] {
            let wv = _mm512_set1_ps(*w[i].add(j));
            let r = v.add(*rows.add(j));
            for c in 0..C {
                acc[i][c] = _mm512_fmadd_ps(wv, E::load16(r.add(16 * c)), acc[i][c]);
            }
        }
    }
    for i in 0..NQ {
        for c in 0..C {
            _mm512_storeu_ps(out[i].add(s + 16 * c), acc[i][c]);
        }
    }
}

/// Output elements `s..s + 8 * C` of `NQ` queries: the keys all of them take together,
/// then each query's remaining keys.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sums_slice<E: Load8, const NQ: usize, const C: usize>(
    out: &[*mut f32; GROUP_MAX],
    w: &[*const f32; GROUP_MAX],
    n: &[usize; GROUP_MAX],
    (v, rows): (*const E, *const usize),
    s: usize,
) {
    let mut acc: [[__m256; C]; NQ] =
        std::array::from_fn(|i| std::array::from_fn(|c| _mm256_loadu_ps(out[i].add(s + 8 * c))));
    let common = n[..NQ].iter().copied().min().unwrap_or(0);
    let v = v.add(s);
    let key = |acc: &mut [[__m256; C]; NQ], j: usize, prefetch: bool| {
        if prefetch {
            // A KV head's values are one piece a block, the next block's elsewhere (as its
            // keys, `scores_t`): the hardware prefetcher barely ramps up within a piece.
            let ahead = v.add(*rows.add(j + VALUE_PREFETCH)).cast::<u8>();
            for line in (0..8 * C * size_of::<E>()).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
            }
        }
        let r = v.add(*rows.add(j));
        let y: [__m256; C] = std::array::from_fn(|c| E::load8(r.add(8 * c)));
        for i in 0..NQ {
            let wv = _mm256_broadcast_ss(&*w[i].add(j));
            for c in 0..C {
                acc[i][c] = _mm256_fmadd_ps(wv, y[c], acc[i][c]);
            }
        }
    };
    each_key!(common, key, acc);
    for i in 0..NQ {
        for j in common..n[i] {
            let wv = _mm256_broadcast_ss(&*w[i].add(j));
            let r = v.add(*rows.add(j));
            for c in 0..C {
                let y = E::load8(r.add(8 * c));
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
