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
    /// `a · b` with AVX2+FMA(+F16C); callers check `cpu::features()` and `len % 8 == 0`.
    fn dot_avx2(a: &[f32], b: &[Self]) -> f32;
    /// `out += w * v` with AVX2+FMA(+F16C); same preconditions.
    fn axpy_avx2(out: &mut [f32], w: f32, v: &[Self]);
    /// `out[i] = v[i]` as f32 (exact) with AVX2+F16C; same preconditions.
    fn widen_avx2(out: &mut [f32], v: &[Self]);
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
    fn widen_avx2(out: &mut [f32], v: &[Self]) {
        out.copy_from_slice(&v[..out.len()]);
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
    fn widen_avx2(out: &mut [f32], v: &[Self]) {
        // SAFETY: as above.
        unsafe { simd::widen_f16(out, v) }
    }
}

/// AVX2 inner loops of attention: 8 lanes, one fixed reduction order.
#[cfg(target_arch = "x86_64")]
mod simd {
    // Index loops mirror the register tiles.
    #![allow(clippy::needless_range_loop)]
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
        assert!(b.len() >= a.len() && a.len().is_multiple_of(8));
        let mut acc = _mm256_setzero_ps();
        for i in (0..a.len()).step_by(8) {
            let x = _mm256_loadu_ps(a.as_ptr().add(i));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
            acc = _mm256_fmadd_ps(x, y, acc);
        }
        hsum(acc)
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

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen_f16(out: &mut [f32], v: &[f16]) {
        assert!(v.len() >= out.len() && out.len().is_multiple_of(8));
        for i in (0..out.len()).step_by(8) {
            let y = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
        }
    }

    /// Lane `j` = `hsum(v[j])`, each with exactly `hsum`'s addition tree (lane `i` + lane
    /// `i + 4`, then `(0 + 2) + (1 + 3)`), so 8 keys' scores equal 8 single dots bit for bit.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum8(v: &[__m256; 8]) -> __m256 {
        let half = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        };
        // u_j = [s(v_j) | s(v_{j+4})], s = 4 lanes of lo + hi.
        let u = [
            half(v[0], v[4]),
            half(v[1], v[5]),
            half(v[2], v[6]),
            half(v[3], v[7]),
        ];
        let pair = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        };
        let w0 = pair(u[0], u[1]);
        let w1 = pair(u[2], u[3]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(w0, w1),
            _mm256_shuffle_ps::<0b11_01_11_01>(w0, w1),
        )
    }

    /// `e^x` in 8 lanes (Cephes `expf`: 2^n by exponent bits times a degree-6 polynomial on
    /// the remainder), within 2 ulp of the exact value over the softmax range (x <= 0).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(88.376_26)),
            _mm256_set1_ps(-88.376_26),
        );
        let fx = _mm256_fmadd_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        );
        let fx = _mm256_floor_ps(fx);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            y,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
        _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n)))
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

    /// `out[j] = (q · k[j]) * scale` for `n` keys stored as f32 rows of `d` in `k`; each
    /// dot with `dot_f16`'s operations in its order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(q: &[f32], k: &[f32], n: usize, scale: f32, out: &mut [f32]) {
        let d = q.len();
        assert!(d.is_multiple_of(8) && k.len() >= n * d && out.len() >= n);
        // Common head sizes get constant row strides (immediate offsets, unrolled chunks).
        match d {
            64 => scores_d::<64>(q.as_ptr(), k.as_ptr(), n, d, scale, out),
            128 => scores_d::<128>(q.as_ptr(), k.as_ptr(), n, d, scale, out),
            _ => scores_d::<0>(q.as_ptr(), k.as_ptr(), n, d, scale, out),
        }
    }

    /// `scores` with the head size `D` known at compile time (`D = 0`: use `d`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_d<const D: usize>(
        q: *const f32,
        k: *const f32,
        n: usize,
        d: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let d = if D == 0 { d } else { D };
        let sv = _mm256_set1_ps(scale);
        let full = n / 8 * 8;
        for j0 in (0..full).step_by(8) {
            let mut acc = [_mm256_setzero_ps(); 8];
            let kj = k.add(j0 * d);
            let mut c = 0;
            while c < d {
                let x = _mm256_loadu_ps(q.add(c));
                let kc = kj.add(c);
                for j in 0..8 {
                    acc[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kc.add(j * d)), acc[j]);
                }
                c += 8;
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(j0), _mm256_mul_ps(hsum8(&acc), sv));
        }
        for j in full..n {
            let mut acc = _mm256_setzero_ps();
            for c in (0..d).step_by(8) {
                let y = _mm256_loadu_ps(k.add(j * d + c));
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(c)), y, acc);
            }
            out[j] = hsum(acc) * scale;
        }
    }

    /// `out += Σ_j w[j] * v[j]` over f32 rows of `out.len()` in `v`, in key order with
    /// `axpy_f16`'s operations, the output held in registers across the keys.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(out: &mut [f32], w: &[f32], v: &[f32]) {
        let d = out.len();
        assert!(d.is_multiple_of(8) && v.len() >= w.len() * d);
        let mut s = 0;
        while s + 64 <= d {
            let (o, vs) = (out.as_mut_ptr().add(s), v.as_ptr().add(s));
            match d {
                64 => weighted_sum_slice::<8, 64>(o, w, vs, d),
                128 => weighted_sum_slice::<8, 128>(o, w, vs, d),
                _ => weighted_sum_slice::<8, 0>(o, w, vs, d),
            }
            s += 64;
        }
        while s < d {
            weighted_sum_slice::<1, 0>(out.as_mut_ptr().add(s), w, v.as_ptr().add(s), d);
            s += 8;
        }
    }

    /// `C` 8-wide chunks of the output over rows of `D` (`D = 0`: of `d`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sum_slice<const C: usize, const D: usize>(
        out: *mut f32,
        w: &[f32],
        v: *const f32,
        d: usize,
    ) {
        let d = if D == 0 { d } else { D };
        let mut acc: [__m256; C] = std::array::from_fn(|c| _mm256_loadu_ps(out.add(8 * c)));
        for (j, &wj) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wj);
            for c in 0..C {
                let y = _mm256_loadu_ps(v.add(j * d + 8 * c));
                acc[c] = _mm256_fmadd_ps(wv, y, acc[c]);
            }
        }
        for c in 0..C {
            _mm256_storeu_ps(out.add(8 * c), acc[c]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        assert!(b.len() >= a.len() && a.len().is_multiple_of(8));
        let mut acc = _mm256_setzero_ps();
        for i in (0..a.len()).step_by(8) {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc,
            );
        }
        hsum(acc)
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
    pub unsafe fn widen_f16(out: &mut [f32], v: &[f16]) {
        out.iter_mut().zip(v).for_each(|(o, y)| *o = y.to_f32())
    }
    pub unsafe fn softmax(x: &mut [f32]) {
        crate::ops::softmax_inplace(x)
    }
    pub unsafe fn scores(q: &[f32], k: &[f32], n: usize, scale: f32, out: &mut [f32]) {
        let d = q.len();
        for j in 0..n {
            out[j] = dot_f32(q, &k[j * d..(j + 1) * d]) * scale;
        }
    }
    pub unsafe fn weighted_sum(out: &mut [f32], w: &[f32], v: &[f32]) {
        let d = out.len();
        for (j, &wj) in w.iter().enumerate() {
            axpy_f32(out, wj, &v[j * d..(j + 1) * d]);
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

/// Shapes shared by every call of one model.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
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

/// `out[t][h] = softmax(q[t][h] · K[0..=pos(t)] / sqrt(d)) · V` for every query row `t` and head `h`.
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
    // each key and value row is fetched once for all of them. Decode steps have few rows, so
    // there the heads of a group are split into separate tiles to keep both cores busy.
    let mut tiles = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.query_len).step_by(ROWS_PER_TILE) {
            tiles.push((si, r0, (r0 + ROWS_PER_TILE).min(s.query_len)));
        }
    }
    let heads_per_tile = if tiles.len() * shape.num_kv_heads >= 4 * pool.num_threads() {
        group
    } else {
        1
    };
    let head_tiles = shape.num_heads / heads_per_tile;
    let out_ptr = SyncPtr::new(out);
    pool.run(tiles.len() * head_tiles, |task| {
        let (si, r0, r1) = tiles[task / head_tiles];
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

/// Query rows handled together; 4 keeps the scores of a tile in L1 at 2K context.
const ROWS_PER_TILE: usize = 4;

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
            block_table: seq.block_table,
        }
    }

    /// Row `row` attends to keys 0..=its position.
    fn num_keys(&self, row: usize) -> usize {
        self.first_pos + (row - self.query_start) + 1
    }

    /// Offset of key `p`'s row for this tile's KV head.
    fn key_row(&self, p: usize) -> usize {
        let slot =
            self.block_table[p / self.block_size] as usize * self.block_size + p % self.block_size;
        slot * self.kv_dim + self.kv_head * self.d
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
    let (num_keys, key_row) = (|row| g.num_keys(row), |p| g.key_row(p));
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
        for p in 0..max_keys {
            let k = &k_cache[key_row(p)..][..d];
            for (qi, &(row, head)) in queries.iter().enumerate() {
                if p < num_keys(row) {
                    let qv = &q[row * q_dim + head * d..][..d];
                    scores[qi * max_keys + p] = dot_f32_kv(qv, k) * scale;
                }
            }
        }
        for (qi, &(row, _)) in queries.iter().enumerate() {
            crate::ops::softmax_inplace(&mut scores[qi * max_keys..qi * max_keys + num_keys(row)]);
        }
        let mut outs: Vec<&mut [f32]> = queries
            .iter()
            .map(|&(row, head)| out_for(row, head))
            .collect();
        outs.iter_mut().for_each(|o| o.fill(0.0));
        for p in 0..max_keys {
            let v = &v_cache[key_row(p)..][..d];
            for (qi, &(row, _)) in queries.iter().enumerate() {
                if p < num_keys(row) {
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
const KEY_BLOCK: usize = 32;

thread_local! {
    static KV_BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The AVX2 path of `attend_tile`: the same per-query operations in the same order as
/// `KvElem::dot_avx2` / `axpy_avx2` per key (so the same bits) around the vectorized
/// softmax (`softmax_dispatched`), but each block of
/// `KEY_BLOCK` K and V rows is widened to f32 once for the whole tile, 8 keys' scores are
/// reduced together, and each output row stays in registers across a block's keys.
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
    let (num_keys, key_row) = (|row| g.num_keys(row), |p| g.key_row(p));
    // Widen keys p0..p1 of `cache` into `buf` (rows of d).
    let widen = |cache: &[E], buf: &mut [f32], p0: usize, p1: usize| {
        for p in p0..p1 {
            E::widen_avx2(&mut buf[(p - p0) * d..][..d], &cache[key_row(p)..][..d]);
        }
    };
    SCORES.with(|cell| {
        KV_BLOCK.with(|kv_cell| {
            let mut scores = cell.borrow_mut();
            let mut buf = kv_cell.borrow_mut();
            scores.clear();
            scores.resize(queries.len() * max_keys, 0.0);
            buf.resize(KEY_BLOCK * d, 0.0);
            for p0 in (0..max_keys).step_by(KEY_BLOCK) {
                let p1 = (p0 + KEY_BLOCK).min(max_keys);
                widen(k_cache, &mut buf, p0, p1);
                for (qi, &(row, head)) in queries.iter().enumerate() {
                    let n = num_keys(row).min(p1).saturating_sub(p0);
                    let qv = &q[row * q_dim + head * d..][..d];
                    let dst = &mut scores[qi * max_keys + p0..][..n];
                    // SAFETY: `simd` was checked by the caller; lengths are checked inside.
                    unsafe { simd::scores(qv, &buf, n, scale, dst) };
                }
            }
            for (qi, &(row, _)) in queries.iter().enumerate() {
                let s = &mut scores[qi * max_keys..qi * max_keys + num_keys(row)];
                // SAFETY: as above.
                unsafe { simd::softmax(s) };
            }
            let mut outs: Vec<&mut [f32]> = queries
                .iter()
                .map(|&(row, head)| out_for(row, head))
                .collect();
            outs.iter_mut().for_each(|o| o.fill(0.0));
            for p0 in (0..max_keys).step_by(KEY_BLOCK) {
                let p1 = (p0 + KEY_BLOCK).min(max_keys);
                widen(v_cache, &mut buf, p0, p1);
                for (qi, &(row, _)) in queries.iter().enumerate() {
                    let n = num_keys(row).min(p1).saturating_sub(p0);
                    let w = &scores[qi * max_keys + p0..][..n];
                    // SAFETY: as above.
                    unsafe { simd::weighted_sum(outs[qi], w, &buf) };
                }
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
