//! Sessions for unit tests: a real actor on the tiny Llama checkpoint's engine, with a plain
//! layout (no template), so tests drive the session logic without HTTP.

use super::budget::QueueBudget;
use super::engine_work::SessionDeps;
use super::state::{Identity, Overflow, SessionParams, SessionSettings};
use super::Session;
use std::path::Path;
use std::sync::Arc;
use vigil_engine::engine::LlmEngine;
use vigil_engine::engine_thread::EngineHandle;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::LoadOptions;

/// The tiny Llama checkpoint behind an engine of `num_blocks` f32 KV blocks of 4 tokens.
pub fn tiny_deps(num_blocks: usize) -> SessionDeps {
    tiny_deps_with(num_blocks, SchedulerConfig::default())
}

/// `tiny_deps` with a scheduler of `config`.
pub fn tiny_deps_with(num_blocks: usize, config: SchedulerConfig) -> SessionDeps {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
    let opts = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    let loaded = vigil_model::load::load(&dir, &opts).expect("the tiny Llama fixture loads");
    let model = loaded.model;
    let kv = KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        num_blocks,
        4,
        KvDtype::F32,
    );
    let engine = EngineHandle::spawn(move || LlmEngine::new(ModelRunner::new(model, kv), config))
        .expect("the engine thread starts");
    SessionDeps {
        engine,
        tokenizer: Arc::new(loaded.tokenizer),
        // The checkpoint's own context (`max_position_embeddings`).
        max_model_len: (4 * num_blocks).min(128),
        metrics: Arc::default(),
        budget: Arc::new(QueueBudget::new(1 << 20)),
        journal: super::journal::Journal::in_memory(),
        kv_disk: None,
    }
}

/// Settings with an opening of `opening` and no template around data or questions.
pub fn plain_settings(opening: Vec<u32>) -> SessionSettings {
    SessionSettings {
        params: SessionParams {
            window: None,
            evict_to: None,
            window_mode: Default::default(),
            pre_decode: false,
            prompt: None,
            overflow: Overflow::DropOldest,
            max_pending: 16,
            max_pending_bytes: 1 << 20,
        },
        wraps: Default::default(),
        opening,
        chat_data_prefix: Vec::new(),
        ready_suffix: Vec::new(),
    }
}

pub fn spawn(deps: SessionDeps, settings: SessionSettings) -> Arc<Session> {
    spawn_as(deps, settings, 1)
}

/// A session on pin `pin` (two sessions on one engine need two pins).
pub fn spawn_as(deps: SessionDeps, settings: SessionSettings, pin: u64) -> Arc<Session> {
    let id = format!("s{pin}");
    Arc::new(Session::spawn(Identity::new(id, pin), settings, deps))
}
