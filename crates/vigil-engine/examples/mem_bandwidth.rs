//! Memory read bandwidth, for the decode floor of scripts/bench_qwen3_shape.sh (weight bytes per
//! token / bandwidth): N threads each stream-sum their own slice of a buffer far larger than L3,
//! best of several passes. Prints one JSON line.
//!
//! Usage: mem_bandwidth [--threads N] [--mib SIZE] [--passes P]

use std::hint::black_box;
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Four independent accumulators so the adds are not one serial dependency chain.
fn stream_sum(xs: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = xs.chunks_exact(4);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*x);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, x| a.wrapping_add(*x));
    acc.iter().fold(tail, |a, x| a.wrapping_add(*x))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads").map_or(Ok(2), |v| v.parse())?;
    let mib: usize = arg(&args, "--mib").map_or(Ok(1024), |v| v.parse())?;
    let passes: usize = arg(&args, "--passes").map_or(Ok(5), |v| v.parse())?;
    if threads == 0 || mib == 0 || passes == 0 {
        return Err("--threads, --mib and --passes must be positive".into());
    }
    // Non-zero contents, written once, so every page is really backed before timing.
    let buf: Vec<u64> = (0..mib * (1 << 20) / 8).map(|i| i as u64).collect();
    let slice_len = buf.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in buf.chunks(slice_len) {
                s.spawn(move || black_box(stream_sum(black_box(part))));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    let bytes = (buf.len() * 8) as f64;
    println!(
        "{{\"bandwidth_gb_s\": {:.2}, \"method\": \"Rust stream sum (mem_bandwidth example), {threads} threads, {mib} MiB buffer, best of {passes}\"}}",
        bytes / best / 1e9
    );
    Ok(())
}
