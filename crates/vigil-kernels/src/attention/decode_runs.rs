//! A decode step's attention by runs of keys: one task per (sequence, run of `RUN_KEYS` keys),
//! each scoring, exponentiating and summing the values of its run for every head, then the
//! runs merged per query in order (`runs::RunState`).
//!
//! A task reads whole cache blocks of all KV heads, so each thread streams contiguous K and V
//! instead of one head's 2 KiB pieces; one dispatch a layer instead of one per phase; and a
//! single long sequence still splits evenly over the threads (SmolLM2 has 3 KV heads for 2
//! threads, Gemma 3 270M one). The runs are the ones a prefill tile walks, with the same
//! operations, so every output has the bits `attend_tile_simd` gives it (the determinism
//! contract).

use super::runs::{self, RunState, RUN_KEYS};
use super::{AttnSeq, AttnShape, KvElem, Tile, TileGeometry};
use crate::pool::{SyncPtr, ThreadPool};

/// Whether `paged_attention` should take `attend_decode_runs`: every sequence decodes one
/// token and the AVX2 kernels apply with runs of whole cache blocks.
pub(super) fn applies(shape: AttnShape, seqs: &[AttnSeq]) -> bool {
    !seqs.is_empty()
        && seqs.iter().all(|s| s.query_len == 1)
        && crate::cpu::features().avx2_fma_f16c
        && shape.head_dim.is_multiple_of(8)
        && shape.block_size.is_multiple_of(8)
        && RUN_KEYS.is_multiple_of(shape.block_size)
}

/// Below this many key values (keys × KV heads × head size, summed over the sequences) a step
/// runs on the calling thread. `attention_bench N T 200 decode`, AVX-512 Xeon, per layer on 1
/// and 2 threads: SmolLM2 (3 × 64) at 16 keys 1.3 and 2.4 µs, 64 keys 2.2 and 3.4, 128 keys 4.3
/// and 3.9; Qwen3-0.6B (8 × 128) at 16 keys 5.4 and 6.9, 32 keys 7.2 and 7.7, 64 keys 11.4 and
/// 10.5.
const PARALLEL_MIN_KEY_VALUES: usize = 24 * 1024;

/// One task: run `run` (the `j`-th) of sequence `si`, for KV heads `kv_heads`.
struct RunTask {
    si: usize,
    j: usize,
    run: std::ops::Range<usize>,
    kv_heads: std::ops::Range<usize>,
}

/// `paged_attention` for a decode step (`applies`).
pub(super) fn attend_decode_runs<E: KvElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    seqs: &[AttnSeq],
    out: &mut [f32],
) {
    let (d, bs) = (shape.head_dim, shape.block_size);
    let group = shape.num_heads / shape.num_kv_heads;
    let q_dim = shape.num_heads * d;
    let wide = shape.wide();
    let lanes = if wide { 16 } else { 8 };
    let tile = |si: usize, kv: usize| Tile {
        seq: &seqs[si],
        rows: seqs[si].query_start..seqs[si].query_start + 1,
        heads: kv * group..(kv + 1) * group,
    };
    let seq_runs: Vec<Vec<std::ops::Range<usize>>> = (0..seqs.len())
        .map(|si| {
            let g = TileGeometry::new(shape, &tile(si, 0));
            let row = seqs[si].query_start;
            runs::runs(g.first_key(row), g.num_keys(row)).collect()
        })
        .collect();
    // Each sequence's first run's index among all runs.
    let run_base: Vec<usize> = (seq_runs.iter())
        .scan(0, |at, r| {
            let first = *at;
            *at += r.len();
            Some(first)
        })
        .collect();
    let total_runs: usize = seq_runs.iter().map(Vec::len).sum();
    // The keys every query reads, times the KV width: a short context's whole step costs less
    // than handing half of it to another thread.
    let key_values: usize = (seq_runs.iter().flatten())
        .map(|r| r.len() * shape.num_kv_heads * d)
        .sum();
    let serial = key_values < PARALLEL_MIN_KEY_VALUES;
    // Too few runs to keep every thread busy (a short context): split them by KV head too.
    let split_heads = !serial && total_runs < 2 * pool.num_threads();
    let mut tasks = Vec::new();
    for (si, rs) in seq_runs.iter().enumerate() {
        for (j, run) in rs.iter().enumerate() {
            let parts = if split_heads { shape.num_kv_heads } else { 1 };
            let per = shape.num_kv_heads / parts;
            tasks.extend((0..parts).map(|h| RunTask {
                si,
                j,
                run: run.clone(),
                kv_heads: h * per..(h + 1) * per,
            }));
        }
    }
    // Per (run, head): its weighted values, and its max and sum.
    let mut partial = vec![0f32; total_runs * shape.num_heads * d];
    let mut stats = vec![(0f32, 0f32); total_runs * shape.num_heads];
    let (partial_ptr, stats_ptr) = (SyncPtr::new(&mut partial), SyncPtr::new(&mut stats));
    let run_task = |t: usize| {
        let task = &tasks[t];
        let (p0, p1) = (task.run.start, task.run.end);
        // Key vectors from the run's first block; the last may reach past `p1` to its block's
        // end (blocks are whole in the cache), so score rows hold that much.
        let vbase = p0 / bs * bs;
        let row_len = p1.next_multiple_of(bs) - vbase;
        let at = |h: usize| (run_base[task.si] + task.j) * shape.num_heads + h;
        // One set of buffers per task, refilled for each KV head: a decode step runs
        // hundreds of these tasks, and their allocations cost as much as a head's `exp`.
        let mut scores = vec![0f32; group * row_len];
        // Every score row is reached through these pointers only, so the kernels' writes and
        // the `exp` pass share one borrow of `scores`.
        let sp = scores.as_mut_ptr();
        let score_rows: Vec<*mut f32> = (0..group).map(|i| sp.wrapping_add(i * row_len)).collect();
        let mut rows = Vec::with_capacity(row_len);
        let mut key_vectors: Vec<(*const E, usize)> = Vec::with_capacity(row_len / lanes);
        let mut q_ptrs = Vec::with_capacity(group);
        let mut weights = Vec::with_capacity(group);
        let mut outs = Vec::with_capacity(group);
        let counts = vec![p1 - p0; group];
        for kv in task.kv_heads.clone() {
            let t = tile(task.si, kv);
            let g = TileGeometry::new(shape, &t);
            g.key_vectors(
                k_cache,
                (vbase, vbase + row_len),
                lanes,
                vbase,
                &mut key_vectors,
            );
            q_ptrs.clear();
            q_ptrs
                .extend((t.heads.clone()).map(|h| q[t.rows.start * q_dim + h * d..][..d].as_ptr()));
            // SAFETY: `applies` checked the features; the query rows have `d` elements; the
            // key vectors were bounds-checked above; each score row holds `row_len` floats.
            unsafe { E::scores_avx2(&q_ptrs, &key_vectors, bs, d, g.scale, &score_rows, wide) };
            weights.clear();
            for (&row, h) in score_rows.iter().zip(t.heads.clone()) {
                // SAFETY: the keys `p0..p1` of a score row of `row_len` floats.
                let s = unsafe { std::slice::from_raw_parts_mut(row.add(p0 - vbase), p1 - p0) };
                // SAFETY: one task per (run, KV head), so each (run, head) slot is written once.
                unsafe { *stats_ptr.get().add(at(h)) = runs::exp_run_dispatched(s) };
                weights.push(s.as_ptr());
            }
            // SAFETY: as above; each head's values are `d` floats of its own slot.
            outs.clear();
            outs.extend((t.heads.clone()).map(|h| unsafe { partial_ptr.get().add(at(h) * d) }));
            g.key_rows(p0, p1, &mut rows);
            // SAFETY: each output has `d` zeroed floats, each weight row `p1 - p0`, and every
            // value row `d` elements (`key_rows`).
            unsafe { E::weighted_sums_avx2(&outs, &weights, &counts, v_cache, &rows, d, wide) };
        }
    };
    if serial {
        (0..tasks.len()).for_each(run_task);
    } else {
        pool.run(tasks.len(), run_task);
    }
    for (si, s) in seqs.iter().enumerate() {
        for h in 0..shape.num_heads {
            let o = &mut out[s.query_start * q_dim + h * d..][..d];
            let mut state = RunState::default();
            for j in 0..seq_runs[si].len() {
                let at = (run_base[si] + j) * shape.num_heads + h;
                let (m, l) = stats[at];
                state.merge(o, m, l, Some(&partial[at * d..(at + 1) * d]));
            }
            state.finish(o);
        }
    }
}
