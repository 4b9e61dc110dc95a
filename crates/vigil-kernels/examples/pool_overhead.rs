//! Per-call overhead of `ThreadPool::run`: trivial tasks (the round trip alone), and tasks of
//! about a microsecond each with a microsecond of caller-only work between calls (a decode
//! step's shape: ~150 small matmuls with a norm or a quantization between them).
//! Usage: `pool_overhead [THREADS]`; prints the median and min–max over 7 rounds.
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use vigil_kernels::pool::{ThreadPool, CHUNKS_PER_THREAD};

/// About `n` ns of arithmetic nobody can skip.
fn spin_work(n: usize) -> f32 {
    let mut x = 1.0f32;
    for i in 0..n {
        x = black_box(x * 1.000_001 + i as f32 * 1e-9);
    }
    x
}

fn rounds(label: &str, mut f: impl FnMut() -> f64) {
    let mut v: Vec<f64> = (0..7).map(|_| f()).collect();
    v.sort_by(f64::total_cmp);
    println!(
        "{label}: {:.2} us per run (min {:.2}, max {:.2})",
        v[3], v[0], v[6]
    );
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let tasks = threads * CHUNKS_PER_THREAD;
    let hits = AtomicUsize::new(0);
    let n = 20_000;
    rounds(&format!("threads {threads}, trivial tasks"), || {
        let t = Instant::now();
        for _ in 0..n {
            pool.run(tasks, |_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        t.elapsed().as_secs_f64() / n as f64 * 1e6
    });
    // Work per call: `tasks` × ~1 µs on the pool, then ~1 µs on the caller alone.
    let unit = 300;
    let t = Instant::now();
    black_box(spin_work(unit * 1000));
    let unit_us = t.elapsed().as_secs_f64() * 1e6 / 1000.0;
    rounds(
        &format!("threads {threads}, {tasks} tasks of {unit_us:.2} us + {unit_us:.2} us serial"),
        || {
            let t = Instant::now();
            for _ in 0..n / 4 {
                pool.run(tasks, |_| {
                    black_box(spin_work(unit));
                });
                black_box(spin_work(unit));
            }
            let ideal = unit_us * (tasks as f64 / threads as f64 + 1.0);
            t.elapsed().as_secs_f64() / (n / 4) as f64 * 1e6 - ideal
        },
    );
}
