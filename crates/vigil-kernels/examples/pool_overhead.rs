//! Per-call overhead of `ThreadPool::run` with trivial tasks.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use vigil_kernels::pool::ThreadPool;

fn main() {
    for threads in [2, 3] {
        let pool = ThreadPool::new(threads);
        let hits = AtomicUsize::new(0);
        let n = 20000;
        let t = Instant::now();
        for _ in 0..n {
            pool.run(threads, |_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        let per = t.elapsed().as_secs_f64() / n as f64;
        println!("threads {threads}: {:.2} us per run", per * 1e6);
    }
}
