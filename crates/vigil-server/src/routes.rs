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
        .route("/v1/messages", post(crate::anthropic::messages::messages))
        .route(
            "/v1/messages/count_tokens",
            post(crate::anthropic::messages::count_tokens),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Records a failed request in the metrics and answers in the error's envelope.
pub fn error_response(state: &SharedState, err: ApiError) -> Response {
    let outcome = if err.status.is_client_error() || err.status == StatusCode::SERVICE_UNAVAILABLE {
        Outcome::ClientError
    } else {
        Outcome::ServerError
    };
    state.metrics.record(outcome);
    err.into_response()
}

/// Sessions arrive with the sessions API; until then a bound turn names a session that does
/// not exist.
pub fn check_session_header(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(v) = headers.get("x-layerscale-session-id") {
        let id = v.to_str().unwrap_or("?");
        return Err(ApiError::not_found(format!("session `{id}` not found")));
    }
    Ok(())
}

async fn authenticate(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    state.metrics.connections.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path();
    let open = matches!(path, "/health" | "/healthz");
    if let (Some(key), false) = (&state.config.api_key, open) {
        let h = req.headers();
        let bearer = h
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            });
        let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
        let matches = |given: Option<&str>| {
            given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())))
        };
        if !(matches(bearer) || matches(x_api_key)) {
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
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
    .into_response()
}

async fn health(State(state): State<SharedState>) -> Response {
    let e = &state.engine.stats;
    let m = &state.metrics;
    let ready = state.is_ready();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let body = json!({
        "status": if ready { "ok" } else { "unavailable" },
        "uptime_ms": state.started.elapsed().as_millis() as u64,
        "queued": e.waiting.load(Ordering::Relaxed),
        "running": e.running.load(Ordering::Relaxed),
        "kv_pages_total": e.kv_blocks_total.load(Ordering::Relaxed),
        "kv_pages_free": e.kv_blocks_free.load(Ordering::Relaxed),
        "kv_page_tokens": e.kv_block_size.load(Ordering::Relaxed),
        "connections": l(&m.connections),
        "steps": l(&e.steps),
        "preemptions": l(&e.preemptions),
        "requests_started": l(&m.requests_started),
        "requests_ok": l(&m.requests_ok),
        "requests_failed": l(&m.requests_client_error) + l(&m.requests_server_error),
        "requests_cancelled": l(&m.requests_cancelled),
        "prompt_tokens": l(&e.prompt_tokens),
        "generated_tokens": l(&e.generated_tokens),
        "prefix_cached_tokens": l(&e.prefix_cached_tokens),
        "tool_calls_malformed": l(&m.tool_calls_malformed),
        "sessions": 0,
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let text = state.metrics.render(&state.engine.stats);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

fn model_json(state: &SharedState) -> serde_json::Value {
    let created_at = crate::ids::rfc3339(state.created);
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "vigil",
        "max_model_len": state.max_model_len,
        "type": "model",
        "display_name": state.model_id,
        "created_at": created_at,
        "max_input_tokens": state.max_model_len.saturating_sub(1),
        "max_tokens": state.max_model_len.saturating_sub(1),
        "lifecycle": "active",
        "capabilities": null,
        "deprecated_at": null,
        "retires_at": null,
        "line": null,
    })
}

async fn list_models(State(state): State<SharedState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [model_json(&state)],
        "has_more": false,
        "first_id": state.model_id,
        "last_id": state.model_id,
    }))
    .into_response()
}

async fn get_model(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    if id.eq_ignore_ascii_case(&state.model_id) {
        Json(model_json(&state)).into_response()
    } else {
        ApiError::not_found(format!(
            "model `{id}` not found (this server serves `{}`)",
            state.model_id
        ))
        .into_response()
    }
}
