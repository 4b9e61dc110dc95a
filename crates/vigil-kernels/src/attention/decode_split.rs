//! A decode step's attention split finer than one task per (sequence, KV head), for when
//! those are too few to keep every thread busy (SmolLM2: 3 KV heads on 2 threads left one
//! thread idle for a third of the step; Gemma 3 270M has one KV head).
//!
//! Three dispatches instead of one, each splitting work whose result does not depend on the
//! split, so every output has the bits `attend_tile_simd` gives it (the determinism
//! contract):
//! 1. scores, by (sequence, KV head, range of key vectors): each score is its own dot
//!    product (`KvElem::scores_avx2`, one lane per key);
//! 2. softmax, by query (`simd::softmax`, as the tile path);
//! 3. weighted value sums, by (sequence, KV head, range of output columns): each output
//!    element gets its FMAs in key order whatever columns share the call
//!    (`KvElem::weighted_sums_avx2`), over the same `KEY_BLOCK` runs of keys.
//!
//! Each key and value element is still read once per step, as in the one-task-per-head path.

use super::{AttnSeq, AttnShape, KvElem, Tile, TileGeometry, KEY_BLOCK};
use crate::pool::{SyncPtr, ThreadPool};

/// Keys from which a decode step's attention is worth two more dispatches: below it the
/// step's attention is short and the even split gains less than the barriers cost.
/// SmolLM2's shape, 30 layers, 2 threads, Zen 3 (`attention_bench LEN 2 50 decode`, 3
/// interleaved rounds, medians per step): 12.0 ms unsplit against 9.1–9.8 split at 2,048 keys,
/// 19.7–21.4 against 17.6–18.9 at 4,096, but 1.3–2.1 against 1.5–2.1 at 512; about even at
/// 1,024.
pub(super) const MIN_KEYS: usize = 1024;

/// Whether `paged_attention` should take `attend_decode_split`: every sequence decodes one
/// token, the AVX2 kernels apply, the (sequence, KV head) tasks do not split evenly over the
/// threads, and the context is long enough.
pub(super) fn worth_it(shape: AttnShape, seqs: &[AttnSeq], threads: usize) -> bool {
    let units = seqs.len() * shape.num_kv_heads;
    threads > 1
        && seqs.iter().all(|s| s.query_len == 1)
        && !units.is_multiple_of(threads)
        && units < 4 * threads
        && seqs.iter().map(|s| s.context_len).max().unwrap_or(0) >= MIN_KEYS
        && crate::cpu::features().avx2_fma_f16c
        && shape.head_dim.is_multiple_of(32)
        && shape.block_size.is_multiple_of(16)
}

/// `paged_attention` for a decode step (`worth_it`).
pub(super) fn attend_decode_split<E: KvElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    seqs: &[AttnSeq],
    out: &mut [f32],
) {
    let (d, group) = (shape.head_dim, shape.num_heads / shape.num_kv_heads);
    let q_dim = shape.num_heads * d;
    let wide = crate::cpu::features().has(crate::cpu::Isa::Avx512)
        && shape.block_size.is_multiple_of(16)
        && d.is_multiple_of(16);
    let lanes = if wide { 16 } else { 8 };
    // One (sequence, KV head) unit's geometry: its query row is the sequence's one row.
    let tile = |si: usize, kv: usize| Tile {
        seq: &seqs[si],
        rows: seqs[si].query_start..seqs[si].query_start + 1,
        heads: kv * group..(kv + 1) * group,
    };
    let units: Vec<(usize, usize)> = (0..seqs.len())
        .flat_map(|si| (0..shape.num_kv_heads).map(move |kv| (si, kv)))
        .collect();
    // Each sequence's score rows (one per head, whole cache blocks long) in one buffer.
    let strides: Vec<usize> = (seqs.iter())
        .map(|s| s.context_len.next_multiple_of(shape.block_size))
        .collect();
    let firsts: Vec<usize> = (strides.iter())
        .scan(0, |at, &s| {
            let first = *at;
            *at += s * shape.num_heads;
            Some(first)
        })
        .collect();
    let total = strides.iter().sum::<usize>() * shape.num_heads;
    let mut scores = vec![0f32; total];
    let scores_ptr = SyncPtr::new(&mut scores);
    let row_of = |si: usize, h: usize| firsts[si] + h * strides[si];

    // 1. Scores: each unit's key vectors in `parts` contiguous ranges.
    let threads = pool.num_threads();
    let parts = even_split(units.len(), threads, usize::MAX);
    pool.run(units.len() * parts, |task| {
        let (si, kv) = units[task / parts];
        let part = task % parts;
        let t = tile(si, kv);
        let g = TileGeometry::new(shape, &t);
        let (bs, start) = (g.block_size, g.first_key(t.rows.start));
        let stride = strides[si];
        let all = (stride - start / bs * bs).div_ceil(lanes);
        let (v0, v1) = (all * part / parts, all * (part + 1) / parts);
        let key_vectors: Vec<(*const E, usize)> = (v0..v1)
            .map(|v| {
                let p = start / bs * bs + v * lanes;
                let at = g.key_col(p - p % bs) + p % bs;
                assert!(at + (d - 1) * bs + lanes <= k_cache.len());
                // SAFETY: in bounds, just checked.
                (unsafe { k_cache.as_ptr().add(at) }, p)
            })
            .collect();
        let q_ptrs: Vec<*const f32> = (t.heads.clone())
            .map(|h| q[t.rows.start * q_dim + h * d..][..d].as_ptr())
            .collect();
        // SAFETY: each head's score row has `stride` floats, and this task writes only the
        // positions of its own key vectors.
        let outs: Vec<*mut f32> = (t.heads.clone())
            .map(|h| unsafe { scores_ptr.get().add(row_of(si, h)) })
            .collect();
        // SAFETY: the AVX2 features were checked (`worth_it`); the query rows have `d`
        // elements; the key vectors were bounds-checked above.
        unsafe { E::scores_avx2(&q_ptrs, &key_vectors, bs, d, g.scale, &outs, wide) };
    });

    // 2. Softmax of each query's scores over its keys.
    let queries: Vec<(usize, usize)> = (0..seqs.len())
        .flat_map(|si| (0..shape.num_heads).map(move |h| (si, h)))
        .collect();
    pool.run(queries.len(), |i| {
        let (si, h) = queries[i];
        let t = tile(si, h / group);
        let g = TileGeometry::new(shape, &t);
        let row = t.rows.start;
        // SAFETY: one task per score row; the row has `stride >= num_keys` floats.
        let s = unsafe { scores_ptr.slice(row_of(si, h), g.num_keys(row)) };
        super::softmax_dispatched(&mut s[g.first_key(row)..]);
    });

    // 3. Weighted value sums: each unit's output columns in `parts` ranges of whole vectors.
    let out_ptr = SyncPtr::new(out);
    let col_parts = even_split(units.len(), threads, d / (2 * lanes));
    let scores = &scores;
    pool.run(units.len() * col_parts, |task| {
        let (si, kv) = units[task / col_parts];
        let part = task % col_parts;
        let t = tile(si, kv);
        let g = TileGeometry::new(shape, &t);
        let row = t.rows.start;
        let vectors = d / lanes;
        let (c0, c1) = (
            vectors * part / col_parts * lanes,
            vectors * (part + 1) / col_parts * lanes,
        );
        // SAFETY: units own disjoint heads of their row; parts disjoint columns of them.
        let outs: Vec<*mut f32> = (t.heads.clone())
            .map(|h| unsafe {
                let o = out_ptr.slice(row * q_dim + h * d + c0, c1 - c0);
                o.fill(0.0);
                o.as_mut_ptr()
            })
            .collect();
        let (first, last) = (g.first_key(row), g.num_keys(row));
        let mut rows = Vec::with_capacity(KEY_BLOCK);
        let mut counts = Vec::with_capacity(outs.len());
        let mut weights: Vec<*const f32> = Vec::with_capacity(outs.len());
        for p0 in (first..last).step_by(KEY_BLOCK) {
            let p1 = (p0 + KEY_BLOCK).min(last);
            g.key_rows(p0, p1, &mut rows);
            rows.iter_mut().for_each(|r| *r += c0);
            counts.clear();
            counts.resize(outs.len(), p1 - p0);
            weights.clear();
            weights.extend((t.heads.clone()).map(|h| scores[row_of(si, h) + p0..].as_ptr()));
            // SAFETY: as in `attend_tile_simd`; each output has `c1 - c0` elements, each
            // weight row `counts`, and every value row `c0 + (c1 - c0) <= d` elements.
            unsafe {
                E::weighted_sums_avx2(&outs, &weights, &counts, v_cache, &rows, c1 - c0, wide)
            };
        }
    });
}

/// Parts to cut each of `units` into so that the tasks share evenly over `threads`: the
/// fewest, at least two tasks a thread, whose total divides by `threads`; at most `cap`.
fn even_split(units: usize, threads: usize, cap: usize) -> usize {
    let least = (2 * threads).div_ceil(units).max(1);
    (least..=least.max(threads))
        .find(|p| (units * p).is_multiple_of(threads))
        .unwrap_or(least)
        .min(cap)
        .max(1)
}
