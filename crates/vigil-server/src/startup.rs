//! `vigil serve`: bind first (so `/health` answers 503 while the model loads), load the model,
//! size the KV pool from its memory budget, start the engine thread, serve until Ctrl-C or
//! SIGTERM, then stop accepting and let in-flight requests finish.

use crate::error::ApiError;
use crate::metrics::ServerMetrics;
use crate::state::{AppState, ServerConfig};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Router;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use vigil_engine::engine::LlmEngine;
use vigil_engine::engine_thread::EngineHandle;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::speculative::DraftModel;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::{LoadOptions, LoadedModel};

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub model_path: PathBuf,
    /// The id `/v1/models` reports (default: the file or directory name).
    pub served_model_name: Option<String>,
    pub load: LoadOptions,
    pub kv_memory_bytes: usize,
    pub block_size: usize,
    pub max_batched_tokens: usize,
    /// Tokens of a step that session work (ingest, flash, warm) may take while client requests
    /// run in it.
    pub session_step_tokens: usize,
    /// Most tokens session work (ingest, warm) computes in one step.
    pub session_chunk_tokens: usize,
    /// Milliseconds within which session work should finish beside client requests (0: 4 steps).
    pub session_deadline_ms: u64,
    /// Tokens of a whole step while session work is due (at most `max_batched_tokens`).
    pub session_step_budget: usize,
    /// Tokens of a whole step while a request decodes (at most `max_batched_tokens`).
    pub decode_step_budget: usize,
    pub enable_prefix_cache: bool,
    /// Map the KV pool's memory at start (`KvCache::prefault`) rather than as rows are first
    /// written.
    pub kv_prefault: bool,
    /// Speculative decoding, server-wide (a request may choose its own method).
    pub speculative: vigil_engine::speculative::SpecConfig,
    /// The draft model for `SpecMethod::Draft`, if one was given.
    pub draft_model: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("loading {path}: {message}")]
    Load { path: String, message: String },
    #[error(
        "the KV memory budget ({bytes} bytes) holds fewer than 2 blocks of {block_bytes} bytes"
    )]
    KvTooSmall { bytes: usize, block_bytes: usize },
    #[error("the engine thread stopped (see the log for the panic); exiting so a supervisor can restart the server")]
    EngineStopped,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    State(#[from] crate::session::journal::store::StoreError),
}

pub async fn serve(config: ServerConfig, opts: EngineOptions) -> Result<(), ServeError> {
    // The model's header and the KV sizing first: a model that cannot load fails before
    // anything says the server is listening.
    let sizing = plan(&opts)?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = std::net::TcpListener::bind(&addr).map_err(|source| ServeError::Bind {
        addr: addr.clone(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    tracing::info!("listening on http://{addr} (loading the model)");

    let started = Instant::now();
    let (stop_loading, loading_stopped) = tokio::sync::oneshot::channel::<()>();
    let loading_listener = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
    let loading_app = loading_router(Arc::new(Loading {
        sizing: sizing.clone(),
        started,
        api_key: config.api_key.clone(),
    }));
    let loading = tokio::spawn(async move {
        axum::serve(loading_listener, loading_app)
            .with_graceful_shutdown(async {
                let _ = loading_stopped.await;
            })
            .await
    });

    let path = opts.model_path.clone();
    let load_opts = opts.load.clone();
    let mut loaded =
        tokio::task::spawn_blocking(move || vigil_model::load::load(&path, &load_opts))
            .await
            .map_err(|e| ServeError::Load {
                path: opts.model_path.display().to_string(),
                message: e.to_string(),
            })?
            .map_err(|e| ServeError::Load {
                path: opts.model_path.display().to_string(),
                message: e.to_string(),
            })?;
    let draft = match opts.draft_model.clone() {
        Some(path) => {
            let load_opts = opts.load.clone();
            let (draft, loaded_back) = tokio::task::spawn_blocking(move || {
                let draft = crate::draft_model::load(&path, &load_opts, &loaded);
                (draft, loaded)
            })
            .await
            .map_err(|e| ServeError::Load {
                path: opts.model_path.display().to_string(),
                message: e.to_string(),
            })?;
            loaded = loaded_back;
            Some(draft?)
        }
        None => None,
    };
    let (journal, kv_disk, restored) = open_journal(&config, &sizing, &loaded)?;
    let state = build_state(
        config.clone(),
        &opts,
        &sizing,
        started,
        (loaded, draft),
        journal,
        kv_disk,
    )?;
    if !restored.is_empty() {
        let t = Instant::now();
        let n = restored.len();
        let started = crate::session::restore::restore_all(&state, restored).await;
        tracing::info!(
            "restored {started} of {n} session(s) in {} ms; their KV is recomputed in the background",
            t.elapsed().as_millis()
        );
    }
    let _ = stop_loading.send(());
    let _ = loading.await;

    let app = crate::routes::router(state.clone());
    state
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    tracing::info!("ready: serving `{}` on http://{addr}", state.model_id);
    // Streamed tokens and events are small writes: the accept loop sets TCP_NODELAY, else
    // each would wait on the client's delayed ACK (up to 40 ms on Linux) behind the previous.
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(crate::session::run_reaper(state.clone()));
    let closing = state.clone();
    let streams = state.clone();
    let probe_state = state.clone();
    let health: crate::listener::HealthProbe = Arc::new(move || {
        let (status, body) = crate::routes::health_now(&probe_state);
        (status.as_u16(), body.to_string())
    });
    let (engine_died_tx, engine_died) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(watch_engine(state.clone(), engine_died_tx));
    let mut died = false;
    let shutdown = async {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = engine_died => died = true,
        }
        // Event streams never end on their own: close them so shutdown can finish.
        closing.sessions.close_streams();
    };
    crate::listener::serve(
        listener,
        app,
        state.config.conn,
        state.metrics.connections.clone(),
        health,
        shutdown,
        || streams.closing.close_all(),
    )
    .await?;
    if died {
        return Err(ServeError::EngineStopped);
    }
    tracing::info!("shut down");
    Ok(())
}

/// Resolves `died` once the engine thread has stopped (a caught panic): the server then shuts
/// down and exits non-zero so a supervisor restarts it, instead of answering 503 forever.
async fn watch_engine(state: Arc<AppState>, died: tokio::sync::oneshot::Sender<()>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    while state.engine.is_alive() {
        tick.tick().await;
    }
    tracing::error!("the engine thread stopped; shutting down");
    let _ = died.send(());
}

/// What the model's configuration decides before any weight is read: its id, the KV pool and
/// `max_model_len`.
#[derive(Debug, Clone)]
struct Sizing {
    model_id: String,
    created: u64,
    num_blocks: usize,
    max_model_len: usize,
}

fn plan(opts: &EngineOptions) -> Result<Sizing, ServeError> {
    let load_err = |message: String| ServeError::Load {
        path: opts.model_path.display().to_string(),
        message,
    };
    let c =
        vigil_model::load::read_config(&opts.model_path).map_err(|e| load_err(e.to_string()))?;
    let block_bytes = c.num_layers * c.kv_dim() * opts.block_size * 2 * 2;
    let num_blocks = opts.kv_memory_bytes / block_bytes.max(1);
    if num_blocks < 2 {
        return Err(ServeError::KvTooSmall {
            bytes: opts.kv_memory_bytes,
            block_bytes,
        });
    }
    let pool_tokens = num_blocks * opts.block_size;
    let trained = c.max_position_embeddings;
    let model_ctx = opts
        .load
        .max_context
        .map_or(trained, |ctx| ctx.min(trained));
    let max_model_len = model_ctx.min(pool_tokens);
    tracing::info!(
        "KV cache: {num_blocks} blocks of {} tokens ({pool_tokens} tokens, {:.1} MiB); max_model_len {max_model_len}",
        opts.block_size,
        (num_blocks * block_bytes) as f64 / (1 << 20) as f64
    );
    let model_id = opts.served_model_name.clone().unwrap_or_else(|| {
        opts.model_path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "vigil".into())
    });
    Ok(Sizing {
        model_id,
        created: crate::ids::unix_now(),
        num_blocks,
        max_model_len,
    })
}

type Journaled = (
    crate::session::journal::Journal,
    Option<Arc<crate::session::journal::kv_disk::KvDisk>>,
    Vec<crate::session::journal::model::DurableSession>,
);

/// Open the state directory (restoring what it holds, and the KV files under it with
/// `--kv-disk`) or, with `--no-persist`, a journal in memory; the sessions to start again.
fn open_journal(
    config: &ServerConfig,
    sizing: &Sizing,
    loaded: &LoadedModel,
) -> Result<Journaled, ServeError> {
    use crate::session::journal::{kv_disk::KvDisk, store, Journal, SEGMENT_LIMIT};
    let Some(dir) = &config.state_dir else {
        tracing::info!("sessions are kept in memory only (--no-persist)");
        return Ok((Journal::in_memory(), None, Vec::new()));
    };
    let fingerprint = store::Fingerprint {
        model: sizing.model_id.clone(),
        vocab_size: loaded.tokenizer.vocab_size(),
    };
    let t = Instant::now();
    let opened = store::open(dir, &fingerprint, SEGMENT_LIMIT)?;
    for note in &opened.notes {
        tracing::warn!("state directory {}: {note}", dir.display());
    }
    let sessions: Vec<_> = opened.model.sessions.values().cloned().collect();
    tracing::info!(
        "sessions are journaled in {} ({} held, read in {} ms)",
        dir.display(),
        sessions.len(),
        t.elapsed().as_millis()
    );
    let kv_disk = if config.kv_disk_bytes > 0 {
        let kv = KvDisk::open(&dir.join("kv"), config.kv_disk_bytes, fingerprint)?;
        tracing::info!(
            "idle sessions' KV is written to {} (up to {} MiB)",
            dir.join("kv").display(),
            config.kv_disk_bytes >> 20
        );
        Some(Arc::new(kv))
    } else {
        None
    };
    let journal = Journal::start(Some(opened.store), opened.model)?;
    Ok((journal, kv_disk, sessions))
}

fn build_state(
    config: ServerConfig,
    opts: &EngineOptions,
    sizing: &Sizing,
    started: Instant,
    (loaded, draft): (LoadedModel, Option<vigil_model::model::Model>),
    journal: crate::session::journal::Journal,
    kv_disk: Option<Arc<crate::session::journal::kv_disk::KvDisk>>,
) -> Result<Arc<AppState>, ServeError> {
    let LoadedModel {
        model,
        tokenizer,
        chat_template,
        max_position_embeddings: _,
    } = loaded;
    let c = &model.config;
    let num_blocks = sizing.num_blocks;
    let template_source = tokenizer.chat_template().map(str::to_string);
    let detected = template_source
        .as_deref()
        .and_then(vigil_model::tool_parser::ToolCallFormat::detect);
    // A template without a tool format still gets tools, through the generic prompt.
    let generic_tools = template_source.is_some() && detected.is_none();
    let tool_format =
        detected.or(generic_tools.then_some(vigil_model::tool_parser::ToolCallFormat::Hermes));
    let supports_thinking = template_source
        .as_deref()
        .is_some_and(|s| s.contains("enable_thinking") && s.contains("<think>"));
    let kv = KvCache::new(
        c.num_layers,
        c.kv_shape(),
        num_blocks,
        opts.block_size,
        KvDtype::F16,
    );
    if opts.kv_prefault {
        // Not the sliding-window layers: their pages go back as the window slides.
        let t = Instant::now();
        let bytes = kv.prefault(&c.window_layers());
        tracing::info!(
            "KV cache: {:.1} MiB mapped at start in {:.2} s",
            bytes as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
    }
    let scheduler = SchedulerConfig {
        max_batched_tokens: opts.max_batched_tokens,
        max_lower_tokens_with_foreground: opts.session_step_tokens,
        session_chunk_tokens: opts.session_chunk_tokens,
        session_deadline_ms: opts.session_deadline_ms,
        session_step_budget: opts.session_step_budget,
        decode_step_budget: opts.decode_step_budget,
        max_seqs: config.max_seqs,
        enable_prefix_cache: opts.enable_prefix_cache,
        ..SchedulerConfig::default()
    };
    let speculative = opts.speculative.clone();
    let draft_model = draft.is_some();
    let block_size = opts.block_size;
    let kv_prefault = opts.kv_prefault;
    let engine = EngineHandle::spawn(move || {
        // Built here: the draft's block pool belongs to the engine thread.
        let draft = draft.map(|mut d| {
            // As many KV tokens as the target's pool (the draft's own memory, beside --kv-memory).
            d.share_pool(&model);
            let c = &d.config;
            let kv = KvCache::new(
                c.num_layers,
                c.kv_shape(),
                num_blocks,
                block_size,
                KvDtype::F16,
            );
            if kv_prefault {
                kv.prefault(&c.window_layers());
            }
            let bytes = kv.num_blocks * kv.block_size * c.num_layers * c.kv_dim() * 4;
            tracing::info!(
                "draft model: {} MiB of KV for {} tokens",
                bytes >> 20,
                num_blocks * block_size
            );
            DraftModel::new(d, kv)
        });
        let mut engine = LlmEngine::new(ModelRunner::new(model, kv), scheduler);
        engine.spec = speculative;
        engine.draft = draft;
        engine
    })?;
    let sessions = crate::session::SessionRegistry::new(
        config.session_ttl,
        config.max_sessions,
        config.max_pending_bytes_total,
        journal,
        kv_disk,
    );
    let cpu_jobs = crate::cpu_jobs::CpuJobs::new(&tokenizer);
    let responses = crate::responses::store::ResponseStore::new(
        engine.clone(),
        config.response_ttl,
        config.max_stored_responses,
    );
    Ok(Arc::new(AppState {
        responses,
        cpu_jobs,
        closing: crate::sse::Closing::default(),
        sessions,
        engine,
        tokenizer: Arc::new(tokenizer),
        template: chat_template.map(Arc::new),
        model_id: sizing.model_id.clone(),
        max_model_len: sizing.max_model_len,
        created: sizing.created,
        started,
        ready: AtomicBool::new(false),
        config,
        metrics: Arc::new(ServerMetrics::default()),
        tool_format,
        generic_tools,
        supports_thinking,
        draft_model,
        grammars: std::sync::OnceLock::new(),
    }))
}

struct Loading {
    sizing: Sizing,
    started: Instant,
    api_key: Option<String>,
}

/// While the weights load: `/health` answers 503 with the usual fields, `/v1/models` already
/// describes the model, everything else is 503 with `Retry-After`.
fn loading_router(info: Arc<Loading>) -> Router {
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    type S = State<Arc<Loading>>;
    let authorized = |info: &Loading, h: &HeaderMap| {
        info.api_key
            .as_deref()
            .is_none_or(|key| crate::routes::has_key(h, key))
    };
    let health = |State(info): S| async move {
        let body = crate::routes::health_json(false, info.started, None);
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    };
    let list = move |State(info): S, h: HeaderMap| async move {
        if !authorized(&info, &h) {
            return ApiError::unauthorized().into_response();
        }
        let z = &info.sizing;
        axum::Json(crate::routes::models_list_json(
            &z.model_id,
            z.created,
            z.max_model_len,
        ))
        .into_response()
    };
    let get = move |State(info): S, h: HeaderMap, Path(id): Path<String>| async move {
        if !authorized(&info, &h) {
            return ApiError::unauthorized().into_response();
        }
        let z = &info.sizing;
        crate::routes::model_or_404(&id, &z.model_id, z.created, z.max_model_len)
    };
    Router::new()
        .route("/health", axum::routing::get(health))
        .route("/healthz", axum::routing::get(health))
        .route("/v1/models", axum::routing::get(list))
        .route("/v1/models/{id}", axum::routing::get(get))
        .fallback(|| async {
            let mut e = ApiError::overloaded("the model is still loading");
            e.retry_after = Some(2);
            e.into_response()
        })
        .with_state(info)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown requested: no new connections; finishing in-flight requests");
}
