//! Paged causal attention over a flat batch: every query row of every sequence attends to its
//! own sequence's keys, read from fixed-size KV blocks through its block table.
//!
//! KV layout per layer, `block_size × kv_dim` elements a block (`kv_dim = kv_heads ×
//! head_dim`, slot `block_id * block_size + offset`):
//! - V rows: element `c` of slot `s`'s values is at `value_index(s, c, ..)`, head-major within
//!   its block, so one KV head's values of a block are `block_size` rows of `head_dim` in one
//!   contiguous piece (2 KiB for SmolLM2), as its keys are: a decode step streams each head's
//!   K and V of a block as two runs instead of 16 rows a whole slot (all heads) apart.
//! - K columns: element `c` of slot `s`'s key is at `key_index(s, c, ..)`, d-major within its
//!   block, so one KV head's keys of a block are `head_dim` runs of `block_size` values: the
//!   transposed tile the score kernel multiplies (one lane per key), read straight from the
//!   cache in f16, with no widening or transposing pass.
//!
//! A query's reduction order depends only on its position and its keys, so the result is the
//! same alone, chunked or batched (the determinism contract).

mod decode_runs;
pub mod runs;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(not(target_arch = "x86_64"))]
#[path = "simd_portable.rs"]
mod simd;
use runs::{RunState, RUN_KEYS};

use crate::pool::{SyncPtr, ThreadPool};
use half::f16;
use std::cell::RefCell;

/// A KV cache element type.
pub trait KvElem: Copy + Send + Sync + Default + 'static {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// `dst[i] = from_f32(src[i])` for the shorter of the two (vectorized for f16).
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = Self::from_f32(s));
    }
    /// `a · b` as the AVX2 attention path computes a score: one FMA per element in order
    /// from 0. Callers check `cpu::features()` and `len % 8 == 0`.
    fn dot_avx2(a: &[f32], b: &[Self]) -> f32;
    /// `out += w * v` with AVX2+FMA(+F16C); same preconditions.
    fn axpy_avx2(out: &mut [f32], w: f32, v: &[Self]);
    /// The AVX2 score kernel over this element type (`simd::scores_t`).
    ///
    /// # Safety
    /// As `simd::scores_t`.
    unsafe fn scores_avx2(
        q: &[*const f32],
        keys: &[(*const Self, usize)],
        stride: usize,
        d: usize,
        scale: f32,
        out: &[*mut f32],
        wide: bool,
    );
    /// The AVX2 weighted value sums over this element type (`simd::weighted_sums`).
    ///
    /// # Safety
    /// As `simd::weighted_sums`.
    unsafe fn weighted_sums_avx2(
        out: &[*mut f32],
        w: &[*const f32],
        n: &[usize],
        v: &[Self],
        rows: &[usize],
        d: usize,
        wide: bool,
    );
}

/// The `KvElem` methods that only forward to the generic kernels of `simd`.
macro_rules! forward_kernels {
    () => {
        unsafe fn scores_avx2(
            q: &[*const f32],
            keys: &[(*const Self, usize)],
            stride: usize,
            d: usize,
            scale: f32,
            out: &[*mut f32],
            wide: bool,
        ) {
            // SAFETY: the caller upholds `simd::scores_t`'s contract.
            unsafe { simd::scores_t(q, keys, stride, d, scale, out, wide) }
        }
        unsafe fn weighted_sums_avx2(
            out: &[*mut f32],
            w: &[*const f32],
            n: &[usize],
            v: &[Self],
            rows: &[usize],
            d: usize,
            wide: bool,
        ) {
            // SAFETY: as above.
            unsafe { simd::weighted_sums(out, w, n, v, rows, d, wide) }
        }
    };
}

/// Where element `c` (of `kv_dim`) of the key in cache slot `slot` lives: d-major within its
/// block (see the module docs).
#[inline]
pub fn key_index(slot: usize, c: usize, kv_dim: usize, block_size: usize) -> usize {
    let (block, offset) = (slot / block_size, slot % block_size);
    block * block_size * kv_dim + c * block_size + offset
}

/// Where element `c` (of `kv_dim`) of the value in cache slot `slot` lives: head-major within
/// its block, one head's `block_size` rows of `head_dim` together (see the module docs).
#[inline]
pub fn value_index(
    slot: usize,
    c: usize,
    head_dim: usize,
    kv_dim: usize,
    block_size: usize,
) -> usize {
    let (block, offset) = (slot / block_size, slot % block_size);
    let (head, e) = (c / head_dim, c % head_dim);
    block * block_size * kv_dim + (head * block_size + offset) * head_dim + e
}

/// Where slot `slot`'s value row lives: one range of `head_dim` elements per KV head, in the
/// row's order (`value_index`).
pub fn value_pieces(
    slot: usize,
    head_dim: usize,
    kv_dim: usize,
    block_size: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..kv_dim).step_by(head_dim).map(move |c| {
        let at = value_index(slot, c, head_dim, kv_dim, block_size);
        at..at + head_dim
    })
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
    forward_kernels!();
}

impl KvElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = dst.len().min(src.len());
        // The same rounding as `from_f32`, 8 at a time where the CPU has F16C.
        dst[..n].convert_from_f32_slice(&src[..n]);
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
    forward_kernels!();
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
    /// Factor of the scores `q · k`: `1 / √head_dim` for most models (`AttnShape::default_scale`),
    /// `1 / √query_pre_attn_scalar` for Gemma.
    pub scale: f32,
}

impl AttnShape {
    /// The usual score scale, `1 / √head_dim`.
    pub fn default_scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }

    /// What the kernels multiply `q · k` by: `scale · log2 e`, so scores are in base-2 units
    /// and the softmax takes `2^(s - max)` (`runs`): the same weights as `e^(s - max)` of the
    /// natural scores, with an exact range reduction and 12 vector operations an exponential
    /// where the natural one takes 19.
    pub fn score_scale(&self) -> f32 {
        self.scale * std::f32::consts::LOG2_E
    }

    /// Whether the kernels take 16 keys (and 16 value elements) a vector: AVX-512, where
    /// blocks and heads divide by 16.
    fn wide(&self) -> bool {
        crate::cpu::features().has(crate::cpu::Isa::Avx512)
            && self.block_size.is_multiple_of(16)
            && self.head_dim.is_multiple_of(16)
    }

    /// Query rows of one sequence a prefill tile takes: 8, or with 16-lane kernels as many
    /// as make 24 queries (12 rows of Qwen3's pairs of heads): two passes of the 12 that
    /// AVX-512's register tiles hold (`simd::scores_t`), where 16 queries took two of 8
    /// (Qwen3's attention over 2,048 tokens 7 % faster, `QWEN3=1 attention_bench 2048 1 5`).
    fn rows_per_tile(&self) -> usize {
        let group = self.num_heads / self.num_kv_heads;
        if self.wide() {
            24usize.div_ceil(group).clamp(ROWS_PER_TILE, 24)
        } else {
            ROWS_PER_TILE
        }
    }
}

/// Write K and V rows of the new tokens into their cache slots (K d-major within its block,
/// `key_index`; V head-major, `value_index`).
pub fn write_kv<E: KvElem>(
    k_cache: &mut [E],
    v_cache: &mut [E],
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    shape: AttnShape,
) {
    let (d, bs) = (shape.head_dim, shape.block_size);
    let kv_dim = shape.num_kv_heads * d;
    // Keys are converted a chunk at a time into `buf`, then scattered `bs` apart: one vector
    // conversion instead of a call per element.
    let mut buf = [E::default(); 64];
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let slot = slot as usize;
        let first = key_index(slot, 0, kv_dim, bs);
        for (i, chunk) in k[t * kv_dim..(t + 1) * kv_dim].chunks(64).enumerate() {
            E::from_f32_slice(&mut buf, chunk);
            for (c, &x) in buf[..chunk.len()].iter().enumerate() {
                k_cache[first + (i * 64 + c) * bs] = x;
            }
        }
        let row = &v[t * kv_dim..(t + 1) * kv_dim];
        for (piece, head) in value_pieces(slot, d, kv_dim, bs).zip(row.chunks_exact(d)) {
            E::from_f32_slice(&mut v_cache[piece], head);
        }
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t][h] = softmax(q[t][h] · K[first(t)..=pos(t)] · scale) · V` for every query row `t`
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
    if decode_runs::applies(shape, seqs) {
        return decode_runs::attend_decode_runs(pool, shape, q, k_cache, v_cache, seqs, out);
    }
    let group = shape.num_heads / shape.num_kv_heads;
    // A tile is up to `rows_per_tile` query rows of one sequence × the heads sharing one KV head:
    // each key and value vector loaded serves all of them. Only when there are fewer such tiles
    // than threads (a decode step of one sequence on a model with one KV head) are the heads
    // split into tiles of their own, at the cost of reading each key and value once per head.
    // Fewer tiles than the threads could share evenly still win: SmolLM2's decode step at 2,048
    // tokens, 3 KV heads on 2 threads, takes 2.33 ms of attention in 3 tiles against 3.08 ms in
    // 9 single-head ones (`attention_bench 2048 2 50 decode`, AVX-512). Decode steps on the AVX2
    // path split by runs of keys instead (`decode_runs`).
    let mut tiles = Vec::new();
    let rows_per_tile = shape.rows_per_tile();
    for (si, s) in seqs.iter().enumerate() {
        for r0 in (0..s.query_len).step_by(rows_per_tile) {
            tiles.push((si, r0, (r0 + rows_per_tile).min(s.query_len)));
        }
    }
    let (tasks, threads) = (tiles.len() * shape.num_kv_heads, pool.num_threads());
    let heads_per_tile = if tasks >= threads { group } else { 1 };
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

/// Query rows handled together (the least, `AttnShape::rows_per_tile`): each K and V block is
/// read once for rows × group queries; 8 keeps a tile's scores (24 rows of keys for a group of
/// 3) within L2 at 2K context.
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
    /// `AttnShape::score_scale`: scores in base-2 units.
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
            scale: shape.score_scale(),
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

    /// Where this tile's KV head's piece of the sequence's `b`-th cache block starts: its keys
    /// in the key cache (`key_index`: d-major, `block_size` keys a row), its value rows in the
    /// value cache (`value_index`). One table lookup, no division.
    fn head_piece(&self, b: usize) -> usize {
        (self.block_table[b] as usize * self.kv_dim + self.kv_head * self.d) * self.block_size
    }

    /// Offset of key `p`'s value row for this tile's KV head (`value_index`).
    fn key_row(&self, p: usize) -> usize {
        self.head_piece(p / self.block_size) + p % self.block_size * self.d
    }

    /// Where element 0 of key `p` is for this tile's KV head; element `c` is `c * block_size`
    /// further on (`key_index`).
    fn key_col(&self, p: usize) -> usize {
        self.head_piece(p / self.block_size) + p % self.block_size
    }

    /// Every vector of `lanes` keys of the cache blocks holding keys `p0..p1` (from `p0`'s
    /// block's first key to `p1`'s block's end) into `out`: where its element 0 is in
    /// `k_cache`, and its first key's position less `origin`. One table lookup per block.
    ///
    /// Panics if a block's piece is not within `k_cache`.
    fn key_vectors<E>(
        &self,
        k_cache: &[E],
        (p0, p1): (usize, usize),
        lanes: usize,
        origin: usize,
        out: &mut Vec<(*const E, usize)>,
    ) {
        let bs = self.block_size;
        out.clear();
        for b in p0 / bs..p1.div_ceil(bs) {
            let at = self.head_piece(b);
            assert!(at + self.d * bs <= k_cache.len());
            // SAFETY: the block's piece is in bounds, just checked.
            let base = unsafe { k_cache.as_ptr().add(at) };
            out.extend((0..bs).step_by(lanes).map(|o| {
                // SAFETY: `o < bs`, within the piece.
                (unsafe { base.add(o) }, b * bs + o - origin)
            }));
        }
    }

    /// `key_row` of keys `p0..p1` into `out`, one table lookup per cache block.
    fn key_rows(&self, p0: usize, p1: usize, out: &mut Vec<usize>) {
        out.clear();
        let mut p = p0;
        while p < p1 {
            let end = ((p / self.block_size + 1) * self.block_size).min(p1);
            let first = self.key_row(p);
            out.extend((0..end - p).map(|i| first + i * self.d));
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
    let (d, q_dim, scale) = (g.d, g.q_dim, g.scale);
    let key_row = |p| g.key_row(p);
    let simd = crate::cpu::features().avx2_fma_f16c
        && d.is_multiple_of(8)
        && g.block_size.is_multiple_of(8);
    let queries: Vec<(usize, usize)> = tile
        .rows
        .clone()
        .flat_map(|r| tile.heads.clone().map(move |h| (r, h)))
        .collect();
    if simd {
        return attend_tile_simd(shape, tile, q, k_cache, v_cache, &queries, out_for);
    }
    // Per query, run by run (`runs`): scores, exponentials, weighted values, merged.
    let mut k = vec![0f32; d];
    let mut o_r = vec![0f32; d];
    let mut s = Vec::with_capacity(runs::RUN_KEYS);
    for &(row, head) in &queries {
        let qv = &q[row * q_dim + head * d..][..d];
        let o = out_for(row, head);
        let mut state = runs::RunState::default();
        for run in runs::runs(g.first_key(row), g.num_keys(row)) {
            s.clear();
            for p in run.clone() {
                let first = g.key_col(p);
                for (c, x) in k.iter_mut().enumerate() {
                    *x = k_cache[first + c * g.block_size].to_f32();
                }
                s.push(dot_f32_kv(qv, &k) * scale);
            }
            let (m, l) = runs::exp_run_scalar(&mut s);
            o_r.fill(0.0);
            for (p, &w) in run.zip(&s) {
                let v = &v_cache[key_row(p)..][..d];
                for (x, &y) in o_r.iter_mut().zip(v) {
                    *x += w * y.to_f32();
                }
            }
            state.merge(o, m, l, Some(&o_r));
        }
        state.finish(o);
    }
}

/// The softmax of natural-unit scores by the exponentials of the attention path this CPU
/// takes: the AVX2 one (`x - max` to base 2, vector `exp2`, 8-lane sum) when available, else
/// `ops::softmax_inplace`. Public so tests can rebuild a query's output from the per-key
/// operations.
pub fn softmax_dispatched(x: &mut [f32]) {
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the features were just checked.
        unsafe { simd::softmax(x) }
    } else {
        crate::ops::softmax_inplace(x)
    }
}

/// The AVX2 path of `attend_tile`: per query the operations of `KvElem::dot_avx2` per key,
/// then run by run (`runs`) the vectorized exponentials (`runs::exp_run_dispatched`) and
/// `KvElem::axpy_avx2` per key in order, merged (so the same bits alone, in any tile, or in a
/// decode step's `decode_runs`). Keys are read d-major straight from the cache (`key_index`),
/// so the scores are a register-tiled product (queries × keys, one lane per score, no
/// horizontal sums) over f16 loads; values are read row by row from the cache while several
/// queries' outputs stay in registers across a run's keys.
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
    let (d, q_dim, scale, max_keys, bs) = (g.d, g.q_dim, g.scale, g.max_keys, g.block_size);
    let num_keys = |row| g.num_keys(row);
    let first_key = |row| g.first_key(row);
    // The tile's keys start at its first row's window (0 without one); a later row's keys
    // before its own window get weight 0 (adding 0 · v to a zero sum leaves it +0, as if the
    // run started at the row's first key, which is where `decode_runs` starts it).
    let start = first_key(tile.rows.start);
    let nq = queries.len();
    // Score rows cover whole cache blocks: the kernel writes 8 keys at a time.
    let stride = max_keys.next_multiple_of(bs);
    let q_ptrs: Vec<*const f32> = queries
        .iter()
        .map(|&(row, head)| q[row * q_dim + head * d..][..d].as_ptr())
        .collect();
    let wide = shape.wide();
    let lanes = if wide { 16 } else { 8 };
    // Every vector of keys of the tile's blocks: where its element 0 is, and its first position.
    let mut key_vectors = Vec::with_capacity((stride - start / bs * bs).div_ceil(lanes));
    g.key_vectors(k_cache, (start, stride), lanes, 0, &mut key_vectors);
    let mut rows = Vec::with_capacity(RUN_KEYS);
    let mut ptrs: Vec<*mut f32> = Vec::with_capacity(nq);
    let mut weights: Vec<*const f32> = Vec::with_capacity(nq);
    let mut counts: Vec<usize> = Vec::with_capacity(nq);
    let mut stats: Vec<(f32, f32)> = Vec::with_capacity(nq);
    let mut states = vec![RunState::default(); nq];
    SCORES.with(|cell| {
        let mut buf = cell.borrow_mut();
        // Scores, then each query's values of the run in hand. Every score an exponential
        // reads is written first, so no clearing.
        if buf.len() < nq * (stride + d) {
            buf.resize(nq * (stride + d), 0.0);
        }
        let (scores, scratch) = buf.split_at_mut(nq * stride);
        let base = scores.as_mut_ptr();
        // SAFETY: each query's row of `stride` scores holds every vector's 8 positions.
        ptrs.extend((0..nq).map(|qi| unsafe { base.add(qi * stride) }));
        // SAFETY: `simd` was checked by the caller; `q_ptrs` rows have `d` elements; the key
        // vectors were bounds-checked above.
        unsafe { E::scores_avx2(&q_ptrs, &key_vectors, bs, d, scale, &ptrs, wide) };
        let mut outs: Vec<&mut [f32]> = queries
            .iter()
            .map(|&(row, head)| out_for(row, head))
            .collect();
        outs.iter_mut().for_each(|o| o.fill(0.0));
        for run in runs::runs(start, max_keys) {
            let (p0, p1) = (run.start, run.end);
            g.key_rows(p0, p1, &mut rows);
            ptrs.clear();
            weights.clear();
            counts.clear();
            stats.clear();
            for (qi, &(row, _)) in queries.iter().enumerate() {
                let keys = first_key(row).max(p0)..num_keys(row).min(p1);
                let s = &mut scores[qi * stride..(qi + 1) * stride];
                let o_r = &mut scratch[qi * d..(qi + 1) * d];
                weights.push(s[p0..].as_ptr());
                if keys.is_empty() {
                    counts.push(0);
                    stats.push((0.0, 0.0));
                    ptrs.push(o_r.as_mut_ptr());
                    continue;
                }
                s[p0..keys.start].fill(0.0);
                stats.push(runs::exp_run_dispatched(&mut s[keys.clone()]));
                counts.push(keys.end - p0);
                // A query's first run sums straight into its (zeroed) output.
                if states[qi].started {
                    o_r.fill(0.0);
                    ptrs.push(o_r.as_mut_ptr());
                } else {
                    ptrs.push(outs[qi].as_mut_ptr());
                }
            }
            // SAFETY: as above; each output has `d` elements, each weight row `counts`.
            unsafe { E::weighted_sums_avx2(&ptrs, &weights, &counts, v_cache, &rows, d, wide) };
            for qi in (0..nq).filter(|&qi| counts[qi] > 0) {
                let (m, l) = stats[qi];
                let o_r = (states[qi].started).then(|| &scratch[qi * d..(qi + 1) * d]);
                states[qi].merge(outs[qi], m, l, o_r);
            }
        }
        for (state, o) in states.iter().zip(outs.iter_mut()) {
            state.finish(o);
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
