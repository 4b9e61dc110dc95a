//! What the engine tests share: a tiny real model behind an engine with a small KV pool, and a
//! deterministic generator that does not depend on the sampler's RNG.

#![allow(dead_code)]

use std::path::Path;
use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::LoadOptions;

/// Tokens per KV block in these tests: small, so that pools run out and blocks get shared.
pub const BLOCK: usize = 4;

/// The tiny Llama checkpoint behind an engine of `num_blocks` f32 KV blocks.
pub fn tiny_engine(num_blocks: usize, config: SchedulerConfig, threads: usize) -> LlmEngine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
    let opts = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    let model = vigil_model::load::load(&dir, &opts).unwrap().model;
    let kv = KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        num_blocks,
        BLOCK,
        KvDtype::F32,
    );
    LlmEngine::new(ModelRunner::new(model, kv), config)
}

/// Give `engine` a draft model from `tests/fixtures/tiny/{dir}` (same vocabulary as the tiny
/// Llama) with `num_blocks` f32 KV blocks, on the engine's kernel threads.
pub fn attach_draft(engine: &mut LlmEngine, dir: &str, num_blocks: usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(dir);
    let opts = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    let mut model = vigil_model::load::load(&path, &opts).unwrap().model;
    model.share_pool(&engine.runner.model);
    let c = &model.config;
    let kv = KvCache::new(c.num_layers, c.kv_shape(), num_blocks, BLOCK, KvDtype::F32);
    engine.draft = Some(vigil_engine::speculative::DraftModel::new(model, kv));
}

pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Exactly `max_tokens` tokens: no stop tokens, EOS ignored.
pub fn stop(max_tokens: usize) -> StopCriteria {
    StopCriteria {
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

/// Greedy sampling.
pub fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}
