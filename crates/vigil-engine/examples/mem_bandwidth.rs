//! Memory read bandwidth, for the decode floors of scripts/bench_decode_vs_llamabench.sh and
//! scripts/bench_qwen3_shape.sh (weight bytes per token / bandwidth): the kernel pool's threads
//! each read their own slice of a buffer far larger than L3 (`plain_read::sum_on`: the widest
//! loads, a prefetch ahead), the buffer in huge pages as loaded weights are, best of several
//! passes. Prints one JSON line.
//!
//! Usage: mem_bandwidth [--threads N] [--mib SIZE] [--passes P]

use std::time::Instant;
use vigil_kernels::plain_read;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::resident_copy;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads").map_or(Ok(2), |v| v.parse())?;
    let mib: usize = arg(&args, "--mib").map_or(Ok(1024), |v| v.parse())?;
    let passes: usize = arg(&args, "--passes").map_or(Ok(5), |v| v.parse())?;
    if threads == 0 || mib == 0 || passes == 0 {
        return Err("--threads, --mib and --passes must be positive".into());
    }
    // Non-zero contents written into every MiB, so every page is backed before timing.
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 131 + 7) as u8).collect();
    let parts: Vec<(usize, &[u8])> = (0..mib).map(|m| (m << 20, &pattern[..])).collect();
    let buf = resident_copy(mib << 20, &parts)?;
    let pool = ThreadPool::new(threads);
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let start = Instant::now();
        std::hint::black_box(plain_read::sum_on(&pool, &[&buf[..]]));
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "{{\"bandwidth_gb_s\": {:.2}, \"method\": \"plain_read::sum (widest loads, prefetch ahead) on {threads} pool threads, {mib} MiB in huge pages, best of {passes}\"}}",
        buf.len() as f64 / best / 1e9
    );
    Ok(())
}
