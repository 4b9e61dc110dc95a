//! Times SmolLM2-135M attention (9 heads, 3 KV heads, head_dim 64, f16 KV): one layer's
//! prefill over a `len`-token prompt, or with `decode` one query row after `len` tokens in each
//! of 30 layers (the model's KV, 47 MB at 2,048 tokens, streamed from memory as in a decode
//! step): `cargo run --release -p vigil-kernels --example attention_bench -- [len] [threads]
//! [reps] [decode]`. `LAYERS=N` sets the decode layers (30 by default; 1 at 256 tokens keeps the
//! KV in L2, timing the kernels without DRAM's noise). The decode KV is in transparent huge
//! pages, as the engine's; `HUGE=0` puts it in 4 KiB pages. `QWEN3=1` times Qwen3-0.6B's
//! decode attention instead (16 heads, 8 KV heads, head_dim 128). Under callgrind use 1 thread, 1 rep.

use half::f16;
use std::time::Instant;
use vigil_kernels::attention::{paged_attention, AttnSeq, AttnShape};
use vigil_kernels::pool::ThreadPool;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// SmolLM2-135M's attention: 9 heads over 3 KV heads of 64, 16-token cache blocks.
fn smollm2_shape() -> AttnShape {
    AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        window: None,
        scale: AttnShape::default_scale(64),
    }
}

/// Qwen3-0.6B's attention: 16 heads over 8 KV heads of 128, 16-token cache blocks.
fn qwen3_shape() -> AttnShape {
    AttnShape {
        num_heads: 16,
        num_kv_heads: 8,
        head_dim: 128,
        block_size: 16,
        window: None,
        scale: AttnShape::default_scale(128),
    }
}

/// Qwen3-0.6B's shape with `QWEN3=1`, else SmolLM2's.
fn shape_from_env() -> AttnShape {
    if std::env::var("QWEN3").is_ok_and(|v| v == "1") {
        qwen3_shape()
    } else {
        smollm2_shape()
    }
}

fn main() {
    let (len, threads, reps) = (arg(1, 512), arg(2, 2), arg(3, 3));
    if std::env::args().nth(4).as_deref() == Some("decode") {
        return decode(len, threads, reps);
    }
    let shape = shape_from_env();
    let (q_dim, kv_dim) = (
        shape.num_heads * shape.head_dim,
        shape.num_kv_heads * shape.head_dim,
    );
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 2000) as f32 / 1000.0 - 1.0
    };
    let blocks = len.div_ceil(16);
    let k: Vec<f16> = (0..blocks * 16 * kv_dim)
        .map(|_| f16::from_f32(rnd()))
        .collect();
    let v: Vec<f16> = (0..blocks * 16 * kv_dim)
        .map(|_| f16::from_f32(rnd()))
        .collect();
    let q: Vec<f32> = (0..len * q_dim).map(|_| rnd()).collect();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let seqs = [AttnSeq {
        query_start: 0,
        query_len: len,
        context_len: len,
        block_table: &table,
    }];
    let mut out = vec![0f32; len * q_dim];
    let pool = ThreadPool::new(threads);
    // QK and PV: 2 · 2 · d FLOP per (query, key, head) over the causal triangle.
    let flop = 4.0 * q_dim as f64 * (len * (len + 1) / 2) as f64;
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        paged_attention(&pool, shape, &q, &k, &v, &seqs, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "len={len} threads={threads}: best {:.3} ms per layer, {:.1} GFLOP/s (checksum {})",
        best * 1e3,
        flop / best / 1e9,
        out.iter().take(64).sum::<f32>()
    );
}

/// One decode row per layer over `len` held tokens, 30 (or `LAYERS`) layers of KV in turn.
fn decode(len: usize, threads: usize, reps: usize) {
    let shape = shape_from_env();
    let (q_dim, kv_dim) = (
        shape.num_heads * shape.head_dim,
        shape.num_kv_heads * shape.head_dim,
    );
    let layers: usize = std::env::var("LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let blocks = len.div_ceil(16);
    let n = blocks * 16 * kv_dim;
    // Every layer's K and V in one anonymous mapping in transparent huge pages, as the
    // engine's KV cache asks for (`KvBuf`); `HUGE=0` leaves it in 4 KiB pages.
    let mut map = memmap2::MmapMut::map_anon(2 * layers * n * 2).expect("mapping the KV");
    if std::env::var("HUGE").map_or(true, |v| v != "0") {
        map.advise(memmap2::Advice::HugePage).expect("madvise");
    }
    let all: &mut [f16] = bytemuck::cast_slice_mut(&mut map[..]);
    for (l, kv) in all.chunks_exact_mut(2 * n).enumerate() {
        kv.fill(f16::from_f32(0.001 * l as f32));
    }
    let layer_kv: Vec<(&[f16], &[f16])> =
        all.chunks_exact(2 * n).map(|kv| kv.split_at(n)).collect();
    let q = vec![0.01f32; q_dim];
    let table: Vec<u32> = (0..blocks as u32).collect();
    let seqs = [AttnSeq {
        query_start: 0,
        query_len: 1,
        context_len: len,
        block_table: &table,
    }];
    let mut out = vec![0f32; q_dim];
    let pool = ThreadPool::new(threads);
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        for (k, v) in &layer_kv {
            paged_attention(&pool, shape, &q, k, v, &seqs, &mut out);
        }
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let bytes = (layers * 2 * len * kv_dim * 2) as f64;
    println!(
        "decode len={len} threads={threads}: median {:.4} ms per step ({} layers, min {:.4}), {:.1} GB/s of KV",
        times[times.len() / 2] * 1e3,
        layers,
        times[0] * 1e3,
        bytes / times[times.len() / 2] / 1e9
    );
}
