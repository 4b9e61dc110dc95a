//! The worker pool: every task runs exactly once per call, on contiguous per-thread ranges,
//! with closures borrowing the caller's stack, across many back-to-back calls, idle gaps that
//! let workers park, nested calls, panics, and warm hints that outlive the memory they name.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use vigil_kernels::pool::ThreadPool;

#[test]
fn every_task_runs_exactly_once_under_stress() {
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.num_threads(), threads);
        for call in 0..3000usize {
            let n = call % 37;
            // Borrowed from this stack frame and mutated through shared references.
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let offset = call * 3;
            pool.run(n, |i| {
                counts[i].fetch_add(offset + 1, Ordering::Relaxed);
            });
            for (i, c) in counts.iter().enumerate() {
                assert_eq!(
                    c.load(Ordering::Relaxed),
                    offset + 1,
                    "threads {threads} call {call} task {i}"
                );
            }
        }
    }
}

#[test]
fn chunks_are_contiguous_and_the_caller_runs_the_first() {
    let pool = ThreadPool::new(3);
    for _ in 0..200 {
        let owner: Vec<Mutex<Option<std::thread::ThreadId>>> =
            (0..100).map(|_| Mutex::new(None)).collect();
        pool.run(100, |i| {
            *owner[i].lock().unwrap() = Some(std::thread::current().id());
        });
        let ids: Vec<_> = owner.iter().map(|o| o.lock().unwrap().unwrap()).collect();
        // Chunk c is tasks [c*100/n, (c+1)*100/n), n = 3 threads × CHUNKS_PER_THREAD: one
        // thread runs each chunk whole (which thread may vary: an idle one claims chunks that
        // a descheduled one has not started).
        let n = 3 * vigil_kernels::pool::CHUNKS_PER_THREAD;
        for c in 0..n {
            let chunk = &ids[c * 100 / n..(c + 1) * 100 / n];
            assert!(
                chunk.iter().all(|id| *id == chunk[0]),
                "chunk {c} split between threads"
            );
        }
        assert_eq!(
            ids[0],
            std::thread::current().id(),
            "the caller runs chunk 0"
        );
    }
}

#[test]
fn an_idle_thread_takes_over_a_busy_ones_chunks_from_the_back() {
    use vigil_kernels::pool::CHUNKS_PER_THREAD;
    let pool = ThreadPool::new(2);
    let n = 2 * CHUNKS_PER_THREAD;
    for _ in 0..50 {
        let done: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let taken_over = Mutex::new(Vec::new());
        let caller = std::thread::current().id();
        pool.run(n, |i| {
            if i == 0 {
                // The caller holds its first chunk until the worker has run all of the
                // caller's others: it must take them over, not wait for them.
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while (1..CHUNKS_PER_THREAD).any(|c| done[c].load(Ordering::Acquire) == 0) {
                    assert!(std::time::Instant::now() < deadline, "no thread took over");
                    std::hint::spin_loop();
                }
            } else if i < CHUNKS_PER_THREAD {
                assert_ne!(std::thread::current().id(), caller);
                taken_over.lock().unwrap().push(i);
            }
            done[i].store(1, Ordering::Release);
        });
        assert!(done.iter().all(|d| d.load(Ordering::Relaxed) == 1));
        // From the back: away from the memory the owner's kernels fetch ahead of it.
        let expected: Vec<usize> = (1..CHUNKS_PER_THREAD).rev().collect();
        assert_eq!(*taken_over.lock().unwrap(), expected);
    }
}

#[test]
fn workers_wake_after_parking() {
    let pool = ThreadPool::new(2);
    for round in 0..5 {
        // Longer than the spin window, so the worker parks between calls.
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        pool.run(1000, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 999 * 1000 / 2, "round {round}");
    }
}

#[test]
fn nested_run_executes_inline() {
    let pool = ThreadPool::new(2);
    let total = AtomicUsize::new(0);
    pool.run(4, |_| {
        pool.run(10, |j| {
            total.fetch_add(j, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 4 * 45);
}

#[test]
fn concurrent_callers_are_serialized() {
    let pool = ThreadPool::new(2);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..300 {
                    let hits = AtomicUsize::new(0);
                    pool.run(16, |_| {
                        hits.fetch_add(1, Ordering::Relaxed);
                    });
                    assert_eq!(hits.load(Ordering::Relaxed), 16);
                }
            });
        }
    });
}

#[test]
fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
    let pool = ThreadPool::new(2);
    for bad in [0usize, 9] {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(10, |i| {
                if i == bad {
                    panic!("task {i} failed");
                }
            })
        }));
        assert!(result.is_err(), "panic in task {bad} must propagate");
    }
    let hits = AtomicUsize::new(0);
    pool.run(10, |_| {
        hits.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(hits.load(Ordering::Relaxed), 10);
}

#[test]
fn a_warm_hint_naming_freed_memory_changes_nothing() {
    let pool = ThreadPool::new(2);
    let weights = vec![7u8; 1 << 20];
    pool.warm_next(&[&weights, &weights[..4096]]);
    let total = AtomicUsize::new(0);
    pool.run(64, |i| {
        total.fetch_add(i, Ordering::Relaxed);
    });
    // The hint now names freed memory; waiting threads keep prefetching it, which must
    // neither fault nor disturb the jobs.
    drop(weights);
    for _ in 0..200 {
        pool.run(64, |i| {
            total.fetch_add(i, Ordering::Relaxed);
        });
    }
    pool.warm_next(&[]);
    assert_eq!(total.load(Ordering::Relaxed), 201 * (63 * 64 / 2));
}
