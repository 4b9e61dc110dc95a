//! The persistent worker pool every parallel kernel runs on.
//!
//! `n - 1` worker threads are created once; the calling thread is the `n`-th. A call to
//! [`ThreadPool::run`] publishes one job (a borrowed closure and a task count) under a new
//! epoch, runs its own share, and returns when every share has finished. Workers spin on the
//! epoch for a short while after each job (decode issues hundreds of small matmuls back to
//! back, and a futex wake costs more than the work) and then park on a condvar.
//!
//! Tasks are split statically into `CHUNKS_PER_THREAD * n` contiguous chunks, chunk `c` being
//! `[c * n_tasks / chunks, (c + 1) * n_tasks / chunks)`. Thread `t` (the caller is thread 0)
//! owns chunks `t * CHUNKS_PER_THREAD ..` and runs them in order, then claims chunks nobody
//! has started: on a busy machine (the HTTP side shares the cores) a descheduled worker then
//! delays a step by at most one of its chunks instead of its whole share. Which thread runs a
//! chunk never changes what the chunk computes.
//!
//! A job's round trip is a few cache-line transfers between cores, and decode makes a few
//! hundred a step: each thread claims from a cursor on its own line (a claim touches another
//! thread's line only to take over its chunks), counts its finished chunks down once per job,
//! and the job's closure sits on the epoch's line, so a worker picks up a job in one transfer.
//!
//! While a thread waits (a worker for the next job, the caller for the job's last chunks) it
//! prefetches the part of the next job's weights it will read first, when the caller named
//! them with [`ThreadPool::warm_next`] (see `warm`).
//!
//! A `run` issued from inside a task (nested parallelism) runs inline on the calling thread.
//! A panic in any task is re-raised on the caller after every chunk has finished.

mod warm;

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use warm::{WarmCursor, WarmHint};

/// Chunks each thread owns per job: more lets busy threads take over a stalled one's work,
/// at the cost of one atomic claim per chunk.
pub const CHUNKS_PER_THREAD: usize = 4;

/// How long an idle worker spins before parking.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(300);

/// How long the caller spins for the last chunks of its job before it yields between checks.
const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(50);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// Placeholder job before the first `run`.
static NO_TASK: fn(usize) = |_| {};

/// One published job: a type-erased pointer to the caller's closure and its task count.
#[derive(Clone, Copy)]
struct Job {
    task: *const Task<'static>,
    n_tasks: usize,
}

/// A value alone on its cache lines (two: the adjacent-line prefetcher pulls pairs), so that
/// threads writing different ones never contend.
#[repr(align(128))]
#[derive(Default)]
struct Line<T>(T);

/// The published job and its epoch, together: a worker that sees the epoch move has the job's
/// line already.
struct Slot {
    /// Bumped (SeqCst) once per job, starting at 1.
    epoch: AtomicUsize,
    job: std::cell::UnsafeCell<Job>,
}

/// How a claim cursor packs its epoch and the bounds of its unclaimed chunks:
/// `(epoch << CURSOR_BITS | front) << CURSOR_BITS | back`.
const CURSOR_BITS: u32 = 8;
const CURSOR_MASK: usize = (1 << CURSOR_BITS) - 1;
const _: () = assert!(CHUNKS_PER_THREAD < 1 << CURSOR_BITS);

/// A claim cursor: in `epoch`, chunks `front..back` of its thread are unclaimed.
fn cursor(epoch: usize, front: usize, back: usize) -> usize {
    (epoch << CURSOR_BITS | front) << CURSOR_BITS | back
}

struct Shared {
    slot: Line<Slot>,
    /// Per thread, which of its own chunks are still unclaimed in an epoch: those from `front`
    /// up to `back` (a cursor from an older epoch has all of them). The owner claims from the
    /// front, in order; another thread takes over from the back, away from the memory the
    /// owner's kernels are fetching ahead. Claiming is a compare-exchange, so a thread that saw
    /// an old epoch can never claim in a newer one.
    cursors: Vec<Line<AtomicUsize>>,
    /// Chunks of the current job not yet finished.
    remaining: Line<AtomicUsize>,
    /// Workers currently parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    shutdown: AtomicBool,
    /// Set by a worker whose task panicked; the payload is kept for the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    lock: Mutex<()>,
    wake: Condvar,
    /// What the next job will read, for waiting threads to prefetch.
    warm: WarmHint,
    num_threads: usize,
    num_chunks: usize,
}

// SAFETY: `job` is written by the caller (holding `ThreadPool::submit`) only between jobs,
// when every chunk of the previous epoch has been claimed and finished; a thread reads it only
// after claiming a chunk of the new epoch, which the caller waits for before returning.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of threads that run data-parallel kernels.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes callers: one job in flight at a time. Holds the caller's progress through
    /// the warm hint.
    submit: Mutex<WarmCursor>,
}

thread_local! {
    /// True on pool workers and on a caller while it runs tasks: a nested `run` goes inline.
    static IN_POOL_TASK: Cell<bool> = const { Cell::new(false) };
}

impl ThreadPool {
    /// A pool of `num_threads` threads in all (the caller counts as one); 0 is treated as 1.
    pub fn new(num_threads: usize) -> ThreadPool {
        let num_threads = num_threads.max(1);
        let shared = Arc::new(Shared {
            slot: Line(Slot {
                epoch: AtomicUsize::new(0),
                job: std::cell::UnsafeCell::new(Job {
                    task: &NO_TASK as &Task<'static>,
                    n_tasks: 0,
                }),
            }),
            cursors: (0..num_threads).map(|_| Line::default()).collect(),
            remaining: Line::default(),
            sleeping: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            warm: WarmHint::default(),
            num_threads,
            num_chunks: num_threads * CHUNKS_PER_THREAD,
        });
        let workers = (1..num_threads)
            .map(|t| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("vigil-pool-{t}"))
                    .spawn(move || {
                        lower_compute_priority();
                        worker_loop(&shared, t)
                    })
                    .expect("spawning a pool worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            submit: Mutex::new(WarmCursor::default()),
        }
    }

    /// A pool with one thread per available CPU (workers at `COMPUTE_NICE`).
    pub fn with_available_parallelism() -> ThreadPool {
        ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn num_threads(&self) -> usize {
        self.shared.num_threads
    }

    /// `f(first_row, rows)` on disjoint chunks of whole rows of `buf` (`width` values a row)
    /// covering it: one chunk per thread when each gets at least `min_rows` rows, else all of
    /// `buf` on the calling thread. For row-wise work (norms, RoPE, element-wise activations)
    /// that would otherwise run on one thread while the others wait for the next matmul.
    pub fn for_row_chunks<T: Send>(
        &self,
        buf: &mut [T],
        width: usize,
        min_rows: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let rows = buf.len() / width.max(1);
        let tasks = self.num_threads().min(rows / min_rows.max(1)).max(1);
        if tasks == 1 {
            return f(0, buf);
        }
        let base = SyncPtr::new(buf);
        self.run(tasks, |i| {
            let (r0, r1) = (i * rows / tasks, (i + 1) * rows / tasks);
            // SAFETY: the tasks' row ranges are disjoint and within `buf`.
            let chunk = unsafe { base.slice(r0 * width, (r1 - r0) * width) };
            f(r0, chunk);
        });
    }

    /// Name the bytes the job after the next `run` will read (up to 4 ranges, in its tasks'
    /// order: a matmul's weight matrices), so that threads waiting in between pull their
    /// parts toward the cache. A hint stays until the next one; an empty one clears it.
    pub fn warm_next(&self, ranges: &[&[u8]]) {
        if self.shared.num_threads > 1 {
            self.shared.warm.set(ranges);
        }
    }

    /// Run `f(i)` for every `i` in `0..n_tasks`, split into contiguous chunks (a few per
    /// thread), and return when all have finished. `f` may borrow from the caller's stack.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        let nested = IN_POOL_TASK.with(|c| c.get());
        if n_tasks <= 1 || self.shared.num_threads == 1 || nested {
            (0..n_tasks).for_each(&f);
            return;
        }
        let mut serial = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let shared = &*self.shared;
        let task: &Task<'_> = &f;
        // SAFETY: the lifetime is erased only for as long as this call, which does not return
        // until every chunk has finished (even when a task panics), and no thread reads the
        // job without first claiming a chunk of this epoch.
        let task: *const Task<'static> = unsafe { std::mem::transmute(task as *const Task<'_>) };
        // SAFETY: between jobs (see `Shared`).
        unsafe { *shared.slot.0.job.get() = Job { task, n_tasks } };
        let epoch = shared.slot.0.epoch.load(Ordering::Relaxed) + 1;
        // Ordered before the epoch's store, which every thread reads before claiming. The
        // caller's first chunk is its own before anyone can see the job.
        shared
            .remaining
            .0
            .store(shared.num_chunks, Ordering::Relaxed);
        let first_claimed = cursor(epoch, 1, CHUNKS_PER_THREAD);
        shared.cursors[0].0.store(first_claimed, Ordering::Relaxed);
        // SeqCst against `sleeping`: a worker about to park sees the epoch or is woken.
        shared.slot.0.epoch.store(epoch, Ordering::SeqCst);
        if shared.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }

        IN_POOL_TASK.with(|c| c.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| run_claimed(shared, epoch, &f, n_tasks)));
        IN_POOL_TASK.with(|c| c.set(false));

        wait_for_chunks(shared, &mut serial);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        let worker_panic = shared
            .panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(payload) = worker_panic {
            resume_unwind(payload);
        }
    }
}

/// Spin until every chunk of the job has finished, warming the next job's first weights;
/// past `SPIN_BEFORE_YIELD`, yield the CPU between checks (a worker the OS descheduled may be
/// waiting for this core).
fn wait_for_chunks(shared: &Shared, warm: &mut WarmCursor) {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while shared.remaining.0.load(Ordering::Acquire) > 0 {
        if warm.step(&shared.warm, 0, shared.num_threads) {
            continue;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        // A decode step waits here 150 times, mostly for a few microseconds: a `sched_yield`
        // on each 64th spin was 2 % of its time, and on a busy host it can hand the core away.
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() > SPIN_BEFORE_YIELD {
            std::thread::yield_now();
        }
    }
}

/// Counts the chunks a thread finished in one job and takes them off `remaining` once, when
/// it drops: after the thread's last chunk, or while a panicking task unwinds (the chunk that
/// panicked counted too), so `remaining` always reaches zero.
struct Finished<'a> {
    remaining: &'a AtomicUsize,
    chunks: usize,
}

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        if self.chunks > 0 {
            self.remaining.fetch_sub(self.chunks, Ordering::Release);
        }
    }
}

/// Claim an unclaimed chunk of thread `owner` in `epoch` for thread `me`: the first one when
/// `me` is the owner, else the last. Its index, or `None` when all of that thread's chunks are
/// claimed (or `epoch` is over).
fn claim(shared: &Shared, epoch: usize, owner: usize, me: usize) -> Option<usize> {
    let slot = &shared.cursors[owner].0;
    let mut seen = slot.load(Ordering::Acquire);
    loop {
        let (front, back) = match (seen >> (2 * CURSOR_BITS)).cmp(&epoch) {
            std::cmp::Ordering::Less => (0, CHUNKS_PER_THREAD),
            std::cmp::Ordering::Equal => ((seen >> CURSOR_BITS) & CURSOR_MASK, seen & CURSOR_MASK),
            std::cmp::Ordering::Greater => return None,
        };
        if front >= back {
            return None;
        }
        let (taken, front, back) = if me == owner {
            (front, front + 1, back)
        } else {
            (back - 1, front, back - 1)
        };
        let claimed = cursor(epoch, front, back);
        match slot.compare_exchange_weak(seen, claimed, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(owner * CHUNKS_PER_THREAD + taken),
            Err(now) => seen = now,
        }
    }
}

/// Run every chunk of `epoch` thread `me` can claim, after `held` (a chunk it claimed
/// already): its own in order, then any other thread's that nobody has started, from that
/// thread's last. `job` gives the job, read only after a claim succeeded (only then is its
/// caller known to be waiting on this epoch).
fn run_claimed_with<'f>(
    shared: &Shared,
    epoch: usize,
    me: usize,
    held: Option<usize>,
    job: impl Fn() -> (&'f (dyn Fn(usize) + Sync + 'f), usize),
) {
    let mut finished = Finished {
        remaining: &shared.remaining.0,
        chunks: 0,
    };
    let (n, chunks) = (shared.num_threads, shared.num_chunks);
    let mut run = |c: usize| {
        let (f, n_tasks) = job();
        // Counted before it runs: a panic unwinds through `finished` with it included.
        finished.chunks += 1;
        (c * n_tasks / chunks..(c + 1) * n_tasks / chunks).for_each(f);
    };
    held.into_iter().for_each(&mut run);
    for k in 0..n {
        let owner = (me + k) % n;
        while let Some(c) = claim(shared, epoch, owner, me) {
            run(c);
        }
    }
}

/// `run_claimed_with` for the caller (thread 0), who holds the closure and claimed its first
/// chunk when it published the job.
fn run_claimed(shared: &Shared, epoch: usize, f: &(dyn Fn(usize) + Sync + '_), n_tasks: usize) {
    run_claimed_with(shared, epoch, 0, Some(0), || (f, n_tasks));
}

fn worker_loop(shared: &Shared, t: usize) {
    IN_POOL_TASK.with(|c| c.set(true));
    let mut seen = 0usize;
    let mut warm = WarmCursor::default();
    loop {
        let epoch = wait_for_epoch(shared, seen, t, &mut warm);
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = epoch;
        // Our own chunks first; then any chunk nobody has started.
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_claimed_with(shared, epoch, t, None, || {
                // SAFETY: called only while holding a claimed chunk of `epoch` (see `Shared`).
                let j = unsafe { *shared.slot.0.job.get() };
                // SAFETY: the caller keeps the closure alive until every chunk finished.
                (unsafe { &*j.task }, j.n_tasks)
            });
        }));
        if let Err(payload) = result {
            let mut slot = shared.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(payload);
        }
    }
}

/// Spin (warming worker `t`'s part of the next job's weights), then park, until the epoch
/// moves past `seen` (or shutdown); returns the new epoch.
fn wait_for_epoch(shared: &Shared, seen: usize, t: usize, warm: &mut WarmCursor) -> usize {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = shared.slot.0.epoch.load(Ordering::SeqCst);
        if e != seen || shared.shutdown.load(Ordering::Relaxed) {
            return e;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && start.elapsed() > SPIN_BEFORE_PARK {
            break;
        }
        if !warm.step(&shared.warm, t, shared.num_threads) {
            std::hint::spin_loop();
        }
    }
    let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
    shared.sleeping.fetch_add(1, Ordering::SeqCst);
    loop {
        let e = shared.slot.0.epoch.load(Ordering::SeqCst);
        if e != seen || shared.shutdown.load(Ordering::SeqCst) {
            shared.sleeping.fetch_sub(1, Ordering::SeqCst);
            return e;
        }
        guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.shared.num_threads)
    }
}

/// A raw pointer into one buffer that pool tasks write in disjoint ranges.
pub struct SyncPtr<T>(pub *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
// SAFETY: users guarantee disjoint access (documented at each use).
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    pub fn new(s: &mut [T]) -> Self {
        SyncPtr(s.as_mut_ptr())
    }

    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    pub fn get(self) -> *mut T {
        self.0
    }

    /// # Safety
    /// `start..start+len` must be in bounds of the original slice and not aliased by another task.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

/// The nice value compute threads (pool workers and the engine thread that calls the pool)
/// run at. A server's I/O threads stay at 0, so when they wake (a flash hit, `/health`, a
/// streamed token) the scheduler runs them ahead of the kernels instead of behind a full time
/// slice of them; the kernels lose only the few microseconds those threads take.
pub const COMPUTE_NICE: i32 = 5;

/// Run the calling thread at `COMPUTE_NICE` (Linux; elsewhere a no-op). Raising one's own
/// nice value needs no privilege.
pub fn lower_compute_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; no memory is shared.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, COMPUTE_NICE);
    }
}
