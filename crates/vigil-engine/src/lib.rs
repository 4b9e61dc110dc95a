//! The serving core: `Sequence`, the paged KV `BlockPool` with prefix caching and
//! copy-on-write forks, `SamplingParams` and the `Sampler`, and the engine loop.

pub mod block_pool;
pub mod block_table;
pub mod sampling;
