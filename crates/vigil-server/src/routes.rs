//! The router: routes, the API-key check, body limits, and the small read-only routes
//! (`/health`, `/metrics`, `/v1/models`).

use crate::error::{ApiError, Flavor};
use crate::metrics::Outcome;
use crate::state::SharedState;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::atomic::Ordering;
use subtle::ConstantTimeEq;

pub fn router(state: SharedState) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/healthz", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route(
            "/v1/chat/completions",
            post(crate::openai::chat::chat_completions),
        )
        .route(
            "/v1/completions",
            post(crate::openai::completions::completions),
        )
        .route("/v1/responses", post(crate::responses::create))
        .route(
            "/v1/responses/{id}",
            get(crate::responses::retrieve).delete(crate::responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(crate::responses::input_items),
        )
        .route("/v1/messages", post(crate::anthropic::messages::messages))
        .route("/tokenize", post(crate::openai::tokenize::tokenize))
        .route("/detokenize", post(crate::openai::tokenize::detokenize))
        .route(
            "/v1/messages/count_tokens",
            post(crate::anthropic::messages::count_tokens),
        )
        .route(
            "/v1/sessions",
            post(crate::session::routes::create).get(crate::session::routes::list),
        )
        .route(
            "/v1/sessions/{id}",
            get(crate::session::routes::get).delete(crate::session::routes::delete),
        )
        .route("/v1/sessions/import", post(crate::session::restore::import))
        .route(
            "/v1/sessions/{id}/export",
            get(crate::session::restore::export),
        )
        .route("/v1/sessions/{id}/push", post(crate::session::routes::push))
        .route("/v1/sessions/{id}/data", get(crate::session::routes::data))
        .route(
            "/v1/sessions/{id}/generate",
            post(crate::session::generate::generate),
        )
        .route("/v1/sessions/{id}/warm", post(crate::session::turn::warm))
        .route(
            "/v1/sessions/{id}/flash",
            post(crate::session::routes::add_flash).get(crate::session::routes::list_flash),
        )
        .route(
            "/v1/sessions/{id}/flash/{fid}",
            axum::routing::delete(crate::session::routes::delete_flash),
        )
        .route(
            "/v1/sessions/{id}/events",
            get(crate::session::stream::events),
        )
        .route("/v1/sessions/{id}/ws", get(crate::session::stream::ws))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::edge::guard,
        ))
        .layer(middleware::map_response(name_the_server))
        .layer(middleware::from_fn(crate::request_id::request_id))
        .with_state(state)
}

/// Every response names the engine and its version, so a benchmark's result file can record
/// what it measured.
async fn name_the_server(mut res: Response) -> Response {
    res.headers_mut().insert(
        axum::http::header::SERVER,
        axum::http::HeaderValue::from_static(concat!("vigil/", env!("CARGO_PKG_VERSION"))),
    );
    res
}

/// Records a failed request in the metrics and answers in the error's envelope.
pub fn error_response(state: &SharedState, err: ApiError) -> Response {
    let outcome = if err.status.is_client_error() || err.status == StatusCode::SERVICE_UNAVAILABLE {
        Outcome::ClientError
    } else {
        Outcome::ServerError
    };
    state.metrics.record(outcome);
    // Inside the request's span: the line names the request id the client got.
    let (status, param) = (err.status.as_u16(), err.param.as_deref().unwrap_or("-"));
    if outcome == Outcome::ServerError {
        tracing::warn!(status, param, "request failed: {}", err.message);
    } else {
        tracing::info!(status, param, "request refused: {}", err.message);
    }
    err.into_response()
}

/// Session turns are chat-shaped; a raw completion cannot be one.
pub fn refuse_session_header(headers: &HeaderMap) -> Result<(), ApiError> {
    if headers.contains_key(crate::session::turn::SESSION_HEADER) {
        return Err(ApiError::invalid(
            crate::session::turn::SESSION_HEADER,
            "session turns run on /v1/chat/completions and /v1/messages, not /v1/completions",
        ));
    }
    Ok(())
}

/// Whether the request carries `key` as `Authorization: Bearer` or `x-api-key` (compared in
/// constant time).
pub fn has_key(h: &HeaderMap, key: &str) -> bool {
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    let matches =
        |given: Option<&str>| given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())));
    matches(bearer) || matches(x_api_key)
}

async fn authenticate(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let open = matches!(path, "/health" | "/healthz");
    if let (Some(key), false) = (&state.config.api_key, open) {
        if !has_key(req.headers(), key) {
            let flavor = if path.starts_with("/v1/messages") {
                Flavor::Anthropic
            } else {
                Flavor::OpenAi
            };
            return ApiError::unauthorized().with_flavor(flavor).into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    let flavor = if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    };
    ApiError::not_found(format!("no route for {} {path}", req.method()))
        .with_flavor(flavor)
        .into_response()
}

async fn health(State(state): State<SharedState>) -> Response {
    let (status, body) = health_now(&state);
    (status, Json(body)).into_response()
}

/// `/health` as it stands: 200 while the model is loaded and the engine thread runs, else 503
/// (`status` says which).
pub fn health_now(state: &SharedState) -> (StatusCode, serde_json::Value) {
    let ready = state.is_ready();
    let engine_alive = state.engine.is_alive();
    let mut body = health_json(
        ready && engine_alive,
        state.started,
        Some((&state.engine.stats, &state.metrics)),
    );
    if ready && !engine_alive {
        body["status"] = json!("engine_stopped");
        body["message"] = json!("the engine thread has stopped; restart the server");
    }
    let status = if ready && engine_alive {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

/// The `/health` body: the same fields whether ready or not (zeros while loading).
pub fn health_json(
    ready: bool,
    started: std::time::Instant,
    live: Option<(
        &vigil_engine::engine_thread::EngineStats,
        &crate::metrics::ServerMetrics,
    )>,
) -> serde_json::Value {
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let u = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as u64;
    let c = |f: &dyn Fn(
        &vigil_engine::engine_thread::EngineStats,
        &crate::metrics::ServerMetrics,
    ) -> u64| { live.map_or(0, |(e, m)| f(e, m)) };
    json!({
        "status": if ready { "ok" } else { "unavailable" },
        "uptime_ms": started.elapsed().as_millis() as u64,
        "queued": c(&|e, _| u(&e.waiting)),
        "running": c(&|e, _| u(&e.running)),
        "kv_pages_total": c(&|e, _| u(&e.kv_blocks_total)),
        "kv_pages_free": c(&|e, _| u(&e.kv_blocks_free)),
        "kv_page_tokens": c(&|e, _| u(&e.kv_block_size)),
        "connections": c(&|_, m| l(&m.connections)),
        "steps": c(&|e, _| l(&e.steps)),
        "preemptions": c(&|e, _| l(&e.preemptions)),
        "graph_captures": 0,
        "requests_started": c(&|_, m| l(&m.requests_started)),
        "requests_ok": c(&|_, m| l(&m.requests_ok)),
        "requests_failed": c(&|_, m| l(&m.requests_client_error) + l(&m.requests_server_error)),
        "requests_cancelled": c(&|_, m| l(&m.requests_cancelled)),
        "prompt_tokens": c(&|e, _| l(&e.prompt_tokens)),
        "generated_tokens": c(&|e, _| l(&e.generated_tokens)),
        "prefix_cached_tokens": c(&|e, _| l(&e.prefix_cached_tokens)),
        "tool_calls_malformed": c(&|_, m| l(&m.tool_calls_malformed)),
        "sessions": c(&|_, m| u(&m.sessions_live)),
        "session_flash_hits": c(&|_, m| l(&m.flash_hits)),
        "session_ingested_tokens": c(&|_, m| l(&m.session_ingested_tokens)),
    })
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let mut text = state.metrics.render(&state.engine.stats);
    let journal = &state.sessions.journal;
    journal.stats.render(&mut text, journal.persistent);
    crate::metrics_vllm::render(
        &mut text,
        &state.metrics,
        &state.engine.stats,
        &state.model_id,
    );
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// The one model entry, in OpenAI's and Anthropic's shapes at once.
pub fn model_json(id: &str, created: u64, max_model_len: usize) -> serde_json::Value {
    json!({
        "id": id,
        "object": "model",
        "created": created,
        "owned_by": "vigil",
        "max_model_len": max_model_len,
        "type": "model",
        "display_name": id,
        "created_at": crate::ids::rfc3339(created),
        "max_input_tokens": max_model_len.saturating_sub(1),
        "max_tokens": max_model_len.saturating_sub(1),
        "lifecycle": "active",
        "capabilities": null,
        "deprecated_at": null,
        "retires_at": null,
        "line": null,
    })
}

pub fn models_list_json(id: &str, created: u64, max_model_len: usize) -> serde_json::Value {
    json!({
        "object": "list",
        "data": [model_json(id, created, max_model_len)],
        "has_more": false,
        "first_id": id,
        "last_id": id,
    })
}

/// `GET /v1/models/{id}`: case-insensitive match, else 404.
pub fn model_or_404(asked: &str, id: &str, created: u64, max_model_len: usize) -> Response {
    if asked.eq_ignore_ascii_case(id) {
        Json(model_json(id, created, max_model_len)).into_response()
    } else {
        ApiError::not_found(format!(
            "model `{asked}` not found (this server serves `{id}`)"
        ))
        .into_response()
    }
}

async fn list_models(State(state): State<SharedState>) -> Response {
    Json(models_list_json(
        &state.model_id,
        state.created,
        state.max_model_len,
    ))
    .into_response()
}

async fn get_model(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    model_or_404(&id, &state.model_id, state.created, state.max_model_len)
}
