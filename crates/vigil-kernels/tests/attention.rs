//! Paged attention against a naive f64 reference (softmax(q·K/√d)·V over each query's causal
//! prefix), and the batch-invariance contract: a sequence's outputs are the same bits alone,
//! batched with other sequences, and with its prefill split into chunks.

use half::f16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vigil_kernels::attention::{
    key_index, paged_attention, value_index, write_kv, AttnSeq, AttnShape,
};
use vigil_kernels::pool::ThreadPool;

/// One sequence's cached K/V (as f32, already rounded to f16) and its block table.
struct Seq {
    k: Vec<f32>,
    v: Vec<f32>,
    table: Vec<u32>,
}

struct Cache {
    k: Vec<f16>,
    v: Vec<f16>,
}

fn shape(num_heads: usize, num_kv_heads: usize, head_dim: usize) -> AttnShape {
    AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
        block_size: 16,
        window: None,
        scale: AttnShape::default_scale(head_dim),
    }
}

/// Random K/V for sequences of `lens` tokens, written to shuffled cache blocks.
fn build(rng: &mut ChaCha8Rng, sh: AttnShape, lens: &[usize]) -> (Cache, Vec<Seq>) {
    let kv_dim = sh.num_kv_heads * sh.head_dim;
    let blocks: usize = lens.iter().map(|l| l.div_ceil(sh.block_size)).sum();
    let mut ids: Vec<u32> = (0..blocks as u32).collect();
    ids.shuffle(rng);
    let mut cache = Cache {
        k: vec![f16::ZERO; blocks * sh.block_size * kv_dim],
        v: vec![f16::ZERO; blocks * sh.block_size * kv_dim],
    };
    let mut next = 0;
    let mut seqs = Vec::new();
    for &len in lens {
        let nb = len.div_ceil(sh.block_size);
        let table = ids[next..next + nb].to_vec();
        next += nb;
        let round = |x: f32| f16::from_f32(x).to_f32();
        let k: Vec<f32> = (0..len * kv_dim)
            .map(|_| round(rng.random_range(-1.0f32..1.0)))
            .collect();
        let v: Vec<f32> = (0..len * kv_dim)
            .map(|_| round(rng.random_range(-1.0f32..1.0)))
            .collect();
        let slots: Vec<u32> = (0..len)
            .map(|p| table[p / sh.block_size] * sh.block_size as u32 + (p % sh.block_size) as u32)
            .collect();
        write_kv(&mut cache.k, &mut cache.v, &k, &v, &slots, sh);
        seqs.push(Seq { k, v, table });
    }
    (cache, seqs)
}

/// Attention of query rows `q` (the last `q.len() / q_dim` positions of `seq`), in f64, over
/// every earlier key or the last `sh.window` of them.
fn reference(sh: AttnShape, seq: &Seq, len: usize, q: &[f32]) -> Vec<f64> {
    let d = sh.head_dim;
    let q_dim = sh.num_heads * d;
    let kv_dim = sh.num_kv_heads * d;
    let rows = q.len() / q_dim;
    let mut out = vec![0f64; q.len()];
    for r in 0..rows {
        let pos = len - rows + r;
        let first = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..sh.num_heads {
            let kvh = h / (sh.num_heads / sh.num_kv_heads);
            let qv = &q[r * q_dim + h * d..][..d];
            let s: Vec<f64> = (first..=pos)
                .map(|p| {
                    let k = &seq.k[p * kv_dim + kvh * d..][..d];
                    qv.iter()
                        .zip(k)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * sh.scale as f64
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for (i, w) in e.iter().enumerate() {
                let v = &seq.v[(first + i) * kv_dim + kvh * d..][..d];
                for i in 0..d {
                    out[r * q_dim + h * d + i] += w / z * v[i] as f64;
                }
            }
        }
    }
    out
}

/// Run `paged_attention` for `(seq index, context_len, query rows)` parts in one batch.
fn run(
    pool: &ThreadPool,
    sh: AttnShape,
    cache: &Cache,
    seqs: &[Seq],
    parts: &[(usize, usize, &[f32])],
) -> Vec<f32> {
    let q_dim = sh.num_heads * sh.head_dim;
    let mut q = Vec::new();
    let mut attn = Vec::new();
    for &(si, ctx, rows) in parts {
        attn.push(AttnSeq {
            query_start: q.len() / q_dim,
            query_len: rows.len() / q_dim,
            context_len: ctx,
            block_table: &seqs[si].table,
        });
        q.extend_from_slice(rows);
    }
    let mut out = vec![f32::NAN; q.len()];
    paged_attention(pool, sh, &q, &cache.k, &cache.v, &attn, &mut out);
    out
}

fn random_q(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect()
}

/// Sequences of `lens` tokens each query their last `qlens` rows in one batch; every output
/// must be within 2e-5 of the f64 reference (outputs are convex combinations of values in
/// [-1, 1]).
fn assert_batch_matches_reference(
    rng: &mut ChaCha8Rng,
    pool: &ThreadPool,
    sh: AttnShape,
    lens: &[usize],
    qlens: &[usize],
) {
    let q_dim = sh.num_heads * sh.head_dim;
    let (cache, seqs) = build(rng, sh, lens);
    let qs: Vec<Vec<f32>> = qlens.iter().map(|&n| random_q(rng, n * q_dim)).collect();
    let parts: Vec<(usize, usize, &[f32])> = (0..lens.len())
        .map(|i| (i, lens[i], qs[i].as_slice()))
        .collect();
    let got = run(pool, sh, &cache, &seqs, &parts);
    let mut at = 0;
    for (i, q) in qs.iter().enumerate() {
        let want = reference(sh, &seqs[i], lens[i], q);
        for (k, w) in want.iter().enumerate() {
            let g = got[at + k] as f64;
            assert!((g - w).abs() <= 2e-5, "{sh:?} seq {i} out[{k}]: {g} vs {w}");
        }
        at += q.len();
    }
}

#[test]
fn matches_reference_on_random_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let pool = ThreadPool::new(2);
    // head_dim 64 and 128 (whole 64-wide register slices), 40 and 72 (8-wide remainders);
    // context lengths around the 32-key blocks and the 8-key score groups. Each sequence
    // queries its last few rows (a prefill chunk, or one decode row).
    // Cache blocks of 16 (the engine's), 8 and 24 take the SIMD path; 5 and 1 the portable
    // one (keys are d-major within a block whatever its size).
    for (heads, kv_heads, d) in [(9, 3, 64), (4, 2, 128), (2, 1, 40), (3, 3, 72)] {
        for block_size in [16, 8, 24, 5, 1] {
            let sh = AttnShape {
                block_size,
                ..shape(heads, kv_heads, d)
            };
            assert_batch_matches_reference(
                &mut rng,
                &pool,
                sh,
                &[1, 7, 33, 70, 131],
                &[1, 7, 5, 70, 3],
            );
        }
    }
}

#[test]
fn sliding_window_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let pool = ThreadPool::new(2);
    // Windows shorter than a tile's rows, than a key block, and longer than the context; both
    // the AVX2 path (d 64) and the portable one (d 36, not a multiple of 8).
    for (d, window) in [
        (64, 1),
        (64, 5),
        (64, 33),
        (64, 100),
        (64, 500),
        (36, 7),
        (36, 70),
    ] {
        let mut sh = shape(4, 2, d);
        sh.window = Some(window);
        assert_batch_matches_reference(&mut rng, &pool, sh, &[3, 64, 131, 260], &[3, 1, 131, 20]);
    }
}

/// A score scale other than `1/√head_dim` (Gemma's `query_pre_attn_scalar`), on the AVX2 path
/// (d 64) and the portable one (d 36), with and without a window.
#[test]
fn custom_scale_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let pool = ThreadPool::new(2);
    for (d, window, scale) in [
        (64, None, 0.3),
        (64, Some(9), 0.05),
        (36, None, 0.41),
        (36, Some(20), 0.2),
    ] {
        let mut sh = shape(4, 2, d);
        sh.window = window;
        sh.scale = scale;
        assert_ne!(scale, AttnShape::default_scale(d));
        assert_batch_matches_reference(&mut rng, &pool, sh, &[3, 64, 131], &[3, 1, 17]);
    }
}

#[test]
fn sliding_window_never_uses_keys_before_it() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let pool = ThreadPool::new(2);
    for d in [64, 36] {
        let mut sh = shape(2, 1, d);
        sh.window = Some(40);
        let (mut cache, seqs) = build(&mut rng, sh, &[300]);
        let q = random_q(&mut rng, 2 * 2 * d);
        // The last two rows (positions 298, 299) attend to keys 259..=299 at most.
        let clean = run(&pool, sh, &cache, &seqs, &[(0, 300, &q)]);
        let kv_dim = d;
        for p in 0..259 {
            let slot = seqs[0].table[p / 16] as usize * 16 + p % 16;
            for c in 0..kv_dim {
                cache.k[key_index(slot, c, kv_dim, 16)] = f16::NAN;
                cache.v[value_index(slot, c, d, kv_dim, 16)] = f16::NAN;
            }
        }
        let poisoned = run(&pool, sh, &cache, &seqs, &[(0, 300, &q)]);
        assert_eq!(bits(&poisoned), bits(&clean), "d {d}");
    }
}

#[test]
fn outputs_do_not_depend_on_batch_or_chunking() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let pool = ThreadPool::new(2);
    let sh = shape(9, 3, 64);
    let q_dim = 9 * 64;
    let lens = [150usize, 90, 40];
    let (cache, seqs) = build(&mut rng, sh, &lens);
    // Sequence 0 prefills all 150 rows.
    let q0 = random_q(&mut rng, 150 * q_dim);
    let alone = run(&pool, sh, &cache, &seqs, &[(0, 150, &q0)]);
    // Batched with a decode row and another prefill.
    let q1 = random_q(&mut rng, q_dim);
    let q2 = random_q(&mut rng, 40 * q_dim);
    let batched = run(
        &pool,
        sh,
        &cache,
        &seqs,
        &[(1, 90, &q1), (0, 150, &q0), (2, 40, &q2)],
    );
    assert_eq!(
        bits(&batched[q_dim..q_dim + q0.len()]),
        bits(&alone),
        "batched"
    );
    // Chunked: rows 0..61 with context 61, then rows 61..150 with context 150.
    let first = run(&pool, sh, &cache, &seqs, &[(0, 61, &q0[..61 * q_dim])]);
    let rest = run(&pool, sh, &cache, &seqs, &[(0, 150, &q0[61 * q_dim..])]);
    assert_eq!(bits(&first), bits(&alone[..61 * q_dim]), "first chunk");
    assert_eq!(bits(&rest), bits(&alone[61 * q_dim..]), "second chunk");
    // One row at a time (decode-like), for a few positions.
    for r in [0usize, 8, 31, 32, 149] {
        let one = run(
            &pool,
            sh,
            &cache,
            &seqs,
            &[(0, r + 1, &q0[r * q_dim..(r + 1) * q_dim])],
        );
        assert_eq!(
            bits(&one),
            bits(&alone[r * q_dim..(r + 1) * q_dim]),
            "row {r}"
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A query's output rebuilt from the per-key operations of the AVX2 path: run by run of
/// `RUN_KEYS` keys (`attention::runs`), one `dot_avx2` per key, the dispatched exponentials,
/// one `axpy_avx2` per key in order, and the runs merged in order.
fn per_key_ops(sh: AttnShape, cache: &Cache, seq: &Seq, len: usize, q: &[f32]) -> Vec<f32> {
    use vigil_kernels::attention::runs::{exp_run_dispatched, runs, RunState};
    use vigil_kernels::attention::KvElem;
    let (d, bs) = (sh.head_dim, sh.block_size);
    let (q_dim, kv_dim) = (sh.num_heads * d, sh.num_kv_heads * d);
    let rows = q.len() / q_dim;
    let slot_of = |p: usize| seq.table[p / bs] as usize * bs + p % bs;
    // The value row of key `p` for the KV head whose first element is `off`.
    let row_of = |p: usize, off: usize| value_index(slot_of(p), off, d, kv_dim, bs);
    // The key's elements gathered from the cache's d-major block layout.
    let key = |p: usize, off: usize| -> Vec<f16> {
        (0..d)
            .map(|c| cache.k[key_index(slot_of(p), off + c, kv_dim, bs)])
            .collect()
    };
    let mut out = vec![0f32; q.len()];
    for r in 0..rows {
        let pos = len - rows + r;
        let first = sh.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..sh.num_heads {
            let off = (h / (sh.num_heads / sh.num_kv_heads)) * d;
            let qv = &q[r * q_dim + h * d..][..d];
            let o = &mut out[r * q_dim + h * d..][..d];
            let mut state = RunState::default();
            for run in runs(first, pos + 1) {
                let mut s: Vec<f32> = (run.clone())
                    .map(|p| f16::dot_avx2(qv, &key(p, off)) * sh.score_scale())
                    .collect();
                let (m, l) = exp_run_dispatched(&mut s);
                let mut o_r = vec![0f32; d];
                for (p, &w) in run.zip(&s) {
                    f16::axpy_avx2(&mut o_r, w, &cache.v[row_of(p, off)..][..d]);
                }
                state.merge(o, m, l, Some(&o_r));
            }
            state.finish(o);
        }
    }
    out
}

#[test]
fn blocked_simd_path_equals_per_key_simd_ops() {
    // The AVX2 path reorganizes loops (transposed key blocks, register tiles of queries) but
    // keeps each query's operations. Same bits.
    if !vigil_kernels::cpu::features().avx2_fma_f16c {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let pool = ThreadPool::new(2);
    for (heads, kv_heads, d) in [(9, 3, 64), (4, 2, 128), (3, 3, 72)] {
        let sh = shape(heads, kv_heads, d);
        let len = 77;
        let (cache, seqs) = build(&mut rng, sh, &[len]);
        let q = random_q(&mut rng, 13 * heads * d);
        let got = run(&pool, sh, &cache, &seqs, &[(0, len, &q)]);
        let want = per_key_ops(sh, &cache, &seqs[0], len, &q);
        assert_eq!(bits(&got), bits(&want), "heads {heads}/{kv_heads} d {d}");
    }
}

#[test]
fn simd_path_equals_per_key_ops_on_ragged_shapes() {
    // Random lengths: query rows not a multiple of the row tile, keys across runs (256), cache blocks of 8 (the SIMD path's multiple; others take the scalar path,
    // checked against the f64 reference) up to past the key block, head sizes with 8-wide
    // remainders, groups of 1 to 8 heads. Each sequence batched with others, and one row of
    // each alone (a decode step; with one KV head its heads are split across tiles), gives
    // the per-key bits.
    if !vigil_kernels::cpu::features().avx2_fma_f16c {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let pool = ThreadPool::new(2);
    for (heads, kv_heads, d, block_size) in [
        (9, 3, 64, 8),
        (9, 3, 64, 24),
        (4, 2, 128, 64),
        (6, 2, 40, 8),
        (3, 3, 72, 32),
        (8, 1, 64, 96),
        (14, 2, 24, 16),
    ] {
        let sh = AttnShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
            block_size,
            window: None,
            scale: AttnShape::default_scale(d),
        };
        let q_dim = heads * d;
        let lens: Vec<usize> = (0..3).map(|_| rng.random_range(1..600)).collect();
        let (cache, seqs) = build(&mut rng, sh, &lens);
        let qs: Vec<Vec<f32>> = lens
            .iter()
            .map(|&len| {
                let rows = rng.random_range(1..=len.min(40));
                random_q(&mut rng, rows * q_dim)
            })
            .collect();
        let parts: Vec<(usize, usize, &[f32])> = (0..lens.len())
            .map(|i| (i, lens[i], qs[i].as_slice()))
            .collect();
        let got = run(&pool, sh, &cache, &seqs, &parts);
        let mut at = 0;
        for (i, q) in qs.iter().enumerate() {
            let what = format!("heads {heads}/{kv_heads} d {d} block {block_size} seq {i}");
            let want = per_key_ops(sh, &cache, &seqs[i], lens[i], q);
            assert_eq!(bits(&got[at..at + q.len()]), bits(&want), "{what}");
            let rows = q.len() / q_dim;
            let r = rng.random_range(0..rows);
            let ctx = lens[i] - rows + r + 1;
            let one = run(
                &pool,
                sh,
                &cache,
                &seqs,
                &[(i, ctx, &q[r * q_dim..][..q_dim])],
            );
            assert_eq!(
                bits(&one),
                bits(&want[r * q_dim..][..q_dim]),
                "{what} row {r}"
            );
            at += q.len();
        }
    }
}

#[test]
fn decode_step_by_runs_equals_per_key_ops() {
    // A decode step (every sequence one row) splits by runs of keys over all KV heads, or by
    // KV head too when the runs are few, or runs on the calling thread when the context is
    // short (`attention::decode_runs`): the per-key bits all the same, and the bits of the
    // same row batched with a prefill of another sequence (which takes the tile path), with
    // and without a sliding window, at 2 and 3 threads.
    if !vigil_kernels::cpu::features().avx2_fma_f16c {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let pools = [ThreadPool::new(2), ThreadPool::new(3)];
    for (heads, kv_heads, d, block_size) in [(9, 3, 64, 16), (4, 1, 256, 16), (6, 3, 32, 32)] {
        for window in [None, Some(700), Some(100)] {
            let sh = AttnShape {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: d,
                block_size,
                window,
                scale: AttnShape::default_scale(d),
            };
            let q_dim = heads * d;
            for lens in [
                [rng.random_range(1024..2200), rng.random_range(256..1100)],
                [rng.random_range(1..300), rng.random_range(2..300)],
                [rng.random_range(1..40), rng.random_range(2..40)],
            ] {
                let (cache, seqs) = build(&mut rng, sh, &lens);
                let q: Vec<f32> = random_q(&mut rng, q_dim);
                let q1: Vec<f32> = random_q(&mut rng, q_dim);
                let other = random_q(&mut rng, 2 * q_dim);
                let what = format!("heads {heads}/{kv_heads} d {d} window {window:?} len {lens:?}");
                let want = per_key_ops(sh, &cache, &seqs[0], lens[0], &q);
                let want1 = per_key_ops(sh, &cache, &seqs[1], lens[1], &q1);
                for pool in &pools {
                    let one = run(pool, sh, &cache, &seqs, &[(0, lens[0], &q)]);
                    assert_eq!(bits(&one), bits(&want), "{what}: per-key ops");
                    let both = run(
                        pool,
                        sh,
                        &cache,
                        &seqs,
                        &[(1, lens[1], &q1), (0, lens[0], &q)],
                    );
                    assert_eq!(bits(&both[..q_dim]), bits(&want1), "{what}: two decodes");
                    assert_eq!(bits(&both[q_dim..]), bits(&want), "{what}: two decodes");
                    // With a prefill row pair of the other sequence: the tile path.
                    let batched = run(
                        pool,
                        sh,
                        &cache,
                        &seqs,
                        &[(1, lens[1], &other), (0, lens[0], &q)],
                    );
                    assert_eq!(bits(&one), bits(&batched[2 * q_dim..]), "{what}: batched");
                }
            }
        }
    }
}

#[test]
fn dispatched_softmax_matches_f64_softmax() {
    // Lengths around the 8-lane groups; scores spread wide enough to underflow some terms.
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for n in (1..40).chain([255, 256, 257]) {
        for spread in [1.0f32, 30.0, 200.0] {
            let x: Vec<f32> = (0..n).map(|_| rng.random_range(-spread..spread)).collect();
            let mut got = x.clone();
            vigil_kernels::attention::softmax_dispatched(&mut got);
            let max = x
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
            let e: Vec<f64> = x.iter().map(|&v| (v as f64 - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for (k, (&g, &w)) in got.iter().zip(&e).enumerate() {
                let want = w / z;
                // A few ulp of relative error for the weights that matter; terms below 1e-12
                // of the total (large score gaps, where the range reduction loses bits) get
                // absolute slack.
                assert!(
                    (g as f64 - want).abs() <= 1e-6 * want + 1e-12,
                    "n {n} spread {spread} [{k}]: {g} vs {want}"
                );
            }
        }
    }
}
