//! TEMPORARY sequential stand-in for the worker pool (replaced by the kernels work).
pub struct ThreadPool;
impl ThreadPool {
    pub fn new(_n: usize) -> Self {
        ThreadPool
    }
    pub fn num_threads(&self) -> usize {
        1
    }
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        (0..n_tasks).for_each(f)
    }
}
