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
}

/// AVX2 inner loops of attention: 8 lanes, one fixed reduction order.
#[cfg(target_arch = "x86_64")]
mod simd {
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
    let d = shape.head_dim;
    let q_dim = shape.num_heads * d;
    let kv_dim = shape.num_kv_heads * d;
    let kv_head = tile.heads.start / (shape.num_heads / shape.num_kv_heads);
    let scale = 1.0 / (d as f32).sqrt();
    let seq = tile.seq;
    let first_pos = seq.context_len - seq.query_len;
    // Row `row` attends to keys 0..=its position.
    let num_keys = |row: usize| first_pos + (row - seq.query_start) + 1;
    let max_keys = num_keys(tile.rows.end - 1);
    let key_row = |p: usize| {
        let slot = seq.block_table[p / shape.block_size] as usize * shape.block_size
            + p % shape.block_size;
        slot * kv_dim + kv_head * d
    };
    let simd = crate::cpu::features().avx2_fma_f16c && d.is_multiple_of(8);
    let queries: Vec<(usize, usize)> = tile
        .rows
        .clone()
        .flat_map(|r| tile.heads.clone().map(move |h| (r, h)))
        .collect();
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.clear();
        scores.resize(queries.len() * max_keys, 0.0);
        for p in 0..max_keys {
            let k = &k_cache[key_row(p)..][..d];
            for (qi, &(row, head)) in queries.iter().enumerate() {
                if p < num_keys(row) {
                    let qv = &q[row * q_dim + head * d..][..d];
                    let dot = if simd {
                        E::dot_avx2(qv, k)
                    } else {
                        dot_f32_kv(qv, k)
                    };
                    scores[qi * max_keys + p] = dot * scale;
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
                    if simd {
                        E::axpy_avx2(outs[qi], w, v);
                    } else {
                        for (o, &x) in outs[qi].iter_mut().zip(v) {
                            *o += w * x.to_f32();
                        }
                    }
                }
            }
        }
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
