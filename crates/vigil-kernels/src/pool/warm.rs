//! Pulling the next job's weights toward the cache while a pool thread waits.
//!
//! Decode runs a few hundred small jobs a step, and between them each thread waits: the worker
//! while the caller does the step's serial work (a norm, quantizing an activation, a dispatch),
//! the caller while the worker finishes its last chunk. The next job usually streams a weight
//! matrix the caller already knows, from DRAM where the cache cannot hold the model, and the
//! memory bus sits idle while both wait. `ThreadPool::warm_next` names those bytes; a waiting
//! thread then prefetches, a few lines per check of what it waits on, the part of them it will
//! read first: thread `t` of `n` owns the chunks starting `t / n` of the way through the next
//! job's tasks, whose rows lie about `t / n` of the way through its bytes (rows are tasks, in
//! byte order, for every matmul layout). A prefetch never faults, so a hint that outlived its
//! matrix costs only bandwidth.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The most byte ranges one hint holds (a grouped matmul's matrices).
pub const MAX_RANGES: usize = 4;

/// Cache lines prefetched per check of the flag a thread waits on: enough to keep the memory
/// system busy, few enough that noticing the flag is late by at most one batch's issue.
const LINES_PER_CHECK: usize = 16;

/// The most bytes one thread pulls per hint: its share of the next matrix up to half of a
/// 512 KiB L2 (Zen 3's), so the lines are still there when its chunks reach them. SmolLM2's
/// decode on an AVX-512 Xeon gained about as much with 32 KiB as with 512 KiB.
const WARM_MAX_BYTES: usize = 256 * 1024;

const LINE: usize = 64;

/// The byte ranges the pool's next job is expected to read, published by the caller.
#[derive(Default)]
pub struct WarmHint {
    /// Bumped after each new set of ranges; a cursor restarts when it sees a new one.
    generation: AtomicUsize,
    /// `[address, length]` per range; unused ones have length 0.
    ranges: [[AtomicUsize; 2]; MAX_RANGES],
}

impl WarmHint {
    /// Publish `ranges` (beyond `MAX_RANGES`, the rest are dropped). Only the pool's single
    /// submitter calls this; a reader racing it may see a mix of old and new ranges, which
    /// only misdirects some prefetches.
    pub fn set(&self, ranges: &[&[u8]]) {
        for (i, slot) in self.ranges.iter().enumerate() {
            let (addr, len) = ranges
                .get(i)
                .map_or((0, 0), |r| (r.as_ptr() as usize, r.len()));
            slot[0].store(addr, Ordering::Relaxed);
            slot[1].store(len, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn snapshot(&self) -> [(usize, usize); MAX_RANGES] {
        std::array::from_fn(|i| {
            let [addr, len] = &self.ranges[i];
            (addr.load(Ordering::Relaxed), len.load(Ordering::Relaxed))
        })
    }
}

/// One thread's progress through the current hint: the hint's ranges as read when its
/// generation was first seen, where this thread's part starts and how much of it is fetched.
#[derive(Default)]
pub struct WarmCursor {
    generation: usize,
    ranges: [(usize, usize); MAX_RANGES],
    start: usize,
    share: usize,
    done: usize,
}

impl WarmCursor {
    /// Prefetch the next lines of thread `t`'s part of `hint` (of `n` threads); false when
    /// that part is done and the caller may pause instead. Once the part is fetched, a call
    /// only reads the hint's generation.
    pub fn step(&mut self, hint: &WarmHint, t: usize, n: usize) -> bool {
        let generation = hint.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.ranges = hint.snapshot();
            let per_thread = self.ranges.iter().map(|r| r.1).sum::<usize>() / n.max(1);
            self.start = t * per_thread;
            self.share = per_thread.min(WARM_MAX_BYTES);
            self.done = 0;
        }
        if self.done >= self.share {
            return false;
        }
        let lines = (self.share - self.done).div_ceil(LINE).min(LINES_PER_CHECK);
        for k in 0..lines {
            if let Some(addr) = address_at(&self.ranges, self.start + self.done + k * LINE) {
                prefetch_l2(addr);
            }
        }
        self.done += lines * LINE;
        true
    }
}

/// The address of byte `pos` of the ranges laid end to end.
fn address_at(ranges: &[(usize, usize)], mut pos: usize) -> Option<usize> {
    for &(addr, len) in ranges {
        if pos < len {
            return Some(addr.wrapping_add(pos));
        }
        pos -= len;
    }
    None
}

/// Ask for the line holding `addr` in L2 (a hint: never faults, even on an unmapped address).
#[inline]
fn prefetch_l2(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64; a prefetch reads nothing architecturally and never
    // faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_walks_its_own_part_once_per_hint() {
        let a = vec![0u8; 4096];
        let b = vec![0u8; 4096];
        let hint = WarmHint::default();
        hint.set(&[&a, &b]);
        // Thread 1 of 2 starts at byte 4096: the first line of `b`.
        let ranges = hint.snapshot();
        assert_eq!(address_at(&ranges, 4096), Some(b.as_ptr() as usize));
        assert_eq!(address_at(&ranges, 8192), None);
        let mut cursor = WarmCursor::default();
        let steps = std::iter::from_fn(|| cursor.step(&hint, 1, 2).then_some(())).count();
        assert_eq!(steps, 4096 / (LINES_PER_CHECK * LINE));
        assert!(!cursor.step(&hint, 1, 2), "done until the next hint");
        hint.set(&[&a]);
        assert!(cursor.step(&hint, 1, 2), "a new hint restarts the cursor");
        hint.set(&[]);
        assert!(
            !cursor.step(&hint, 0, 2),
            "an empty hint has nothing to warm"
        );
    }
}
