//! The serving core: `Sequence`, the paged KV `BlockPool` with prefix caching and
//! copy-on-write forks, `SamplingParams` and the `Sampler`, the `Scheduler`, the
//! `ModelRunner`, speculative decoding (`speculative/`), and `LlmEngine` whose `step()` ties them together.

pub mod block_pool;
pub mod block_table;
pub mod constraint;
pub mod engine;
pub mod engine_thread;
pub mod grammar;
mod local_kv;
pub mod model_runner;
pub mod pins;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
