//! Sampling: `SamplingParams` and the `Sampler` (filled in by the engine-pieces work).
