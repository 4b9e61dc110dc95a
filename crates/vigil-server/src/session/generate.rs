//! `POST /v1/sessions/{id}/generate`: a question against the session's durable context, on a
//! copy-on-write fork of its KV (the session is left unchanged; several may run at once).
//! Two shortcuts come first: a flash query's cached answer, and with `pre_decode` the
//! speculative exit from the ready-position distribution.

use super::flash::FlashAnswer;
use super::flash::Lookup;
use super::handle::{Held, Hold};
use super::layout;
use super::Session;
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, Finish, GenEvent, GenParams, Usage};
use crate::openai::params::{self, max_tokens};
use crate::openai::types::{CommonParams, StopField};
use crate::routes::error_response;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_engine::pins::PinUse;

/// How long a generate demanding a fresher flash answer waits for the evaluation in flight.
const FRESHNESS_WAIT: Duration = Duration::from_secs(120);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateRequest {
    prompt: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<i64>,
    ignore_eos: Option<bool>,
    stop: Option<StopField>,
    stream: Option<bool>,
    fast_answer: Option<Vec<String>>,
    gap_threshold: Option<f32>,
    reasoning_effort: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
    /// Vigil: serve this flash query's answer.
    flash_id: Option<u64>,
    /// Vigil: `false` always generates.
    use_flash: Option<bool>,
    /// Vigil: a flash answer must be at least this version...
    min_data_version: Option<u64>,
    /// Vigil: ... or at most this many versions behind the session.
    max_staleness: Option<u64>,
}

pub async fn generate(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match generate_inner(&state, &id, body).await {
        Ok(r) => r,
        Err(e) => error_response(&state, e),
    }
}

async fn generate_inner(
    state: &SharedState,
    id: &str,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let session = state.sessions.get(id)?;
    let req: GenerateRequest = parse_body(body, Flavor::OpenAi)?;
    let question = match (req.prompt.as_deref(), req.flash_id) {
        (Some(p), _) if !p.is_empty() => p.to_string(),
        // `flash_id` alone asks that query (generated, if its answer cannot be served).
        (None, Some(fid)) => match session.flash_query(fid) {
            Some(q) => q,
            None => {
                return Err(ApiError::not_found(format!(
                    "flash query `{fid}` not found on session `{id}`"
                )))
            }
        },
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` is required and must not be empty",
            ))
        }
    };
    let common = CommonParams {
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        ..CommonParams::default()
    };
    let sampling = params::sampling_params(&common, state.tokenizer.vocab_size(), None)?;
    let stop = params::stop_strings(&req.stop, "stop")?;
    let max = max_tokens(req.max_tokens.or(req.max_completion_tokens), "max_tokens")?;
    if let Some(g) = req.gap_threshold {
        if !g.is_finite() || g < 0.0 {
            return Err(ApiError::invalid(
                "gap_threshold",
                "must be a non-negative number",
            ));
        }
    }
    let kwargs = crate::prompt::template_kwargs(
        req.chat_template_kwargs.as_ref(),
        req.reasoning_effort.as_deref(),
        "chat_template_kwargs",
    )?;
    // Thinking settings change the generation prompt (and so rule out cached answers): render
    // the session's layout with them on the pool; the default one was built at creation.
    let custom_wrap = if kwargs.is_empty() {
        None
    } else {
        let (st, s, kw) = (state.clone(), session.clone(), kwargs.clone());
        Some(
            crate::cpu_jobs::run(state, move || {
                let opening = s.settings.params.prompt.as_deref();
                let shortcuts = layout::default_generation_prompt(&st, opening, &kw);
                let data = layout::question(&st, super::state::Layout::Data, opening, &kw)?;
                let chat = layout::question(&st, super::state::Layout::Chat, opening, &kw)?;
                Ok((shortcuts, layout::Wraps { data, chat }))
            })
            .await?,
        )
    };
    let shortcuts = custom_wrap.as_ref().is_none_or(|c| c.0);
    let stream = req.stream.unwrap_or(false);
    let gen_id = crate::ids::new_id("gen-");

    if shortcuts && req.use_flash != Some(false) {
        let wanted = FlashWanted {
            flash_id: req.flash_id,
            query: &question,
            min_data_version: req.min_data_version,
            max_staleness: req.max_staleness,
        };
        if let Some(hit) = flash_answer(state, &session, wanted).await? {
            return Ok(shortcut_response(state, &session, &gen_id, hit, stream));
        }
    } else if req.flash_id.is_some() && req.use_flash == Some(false) {
        return Err(ApiError::invalid(
            "flash_id",
            "`flash_id` cannot be combined with `use_flash: false`",
        ));
    }
    if let (true, true, Some(cands)) = (
        shortcuts,
        session.settings.params.pre_decode,
        &req.fast_answer,
    ) {
        let threshold = req.gap_threshold.unwrap_or(2.0);
        if let Some(hit) = speculative(state, &session, cands, threshold).await? {
            return Ok(shortcut_response(state, &session, &gen_id, hit, stream));
        }
    }

    if let Some(v) = req.min_data_version {
        reach_version(&session, v).await?;
    }
    let guard = Hold::new(session.clone(), Held::Foreground);
    let ctx = session.context().await?;
    let (mirror, version, layout_now) = (ctx.mirror, ctx.data_version, ctx.layout);
    let wraps = custom_wrap
        .as_ref()
        .map_or(&session.settings.wraps, |c| &c.1);
    let wrap = wraps.at(layout_now);
    let text = format!("{}{}{}", wrap.before, question, wrap.after);
    let q_tokens = crate::cpu_jobs::encode(state, text, false, "prompt").await?;
    let mut prompt = mirror;
    prompt.extend(q_tokens);
    let mut gp = GenParams::new(prompt, sampling, max);
    gp.stop_strings = stop;
    gp.ignore_eos = req.ignore_eos.unwrap_or(false);
    gp.pin = Some(PinUse {
        key: session.pin,
        save: None,
        save_on_abort: false,
    });
    gp.on_finish = Some(Box::new(move |_| drop(guard)));
    let rx = generate::start(state, gp)?;
    let head = json!({"id": gen_id, "object": "session.generation", "session_id": session.id, "data_version": version});
    if stream {
        Ok(stream_response(state, rx, head))
    } else {
        collect_response(rx, head).await
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn finish_reason(f: &Finish) -> &'static str {
    match f {
        Finish::Eos | Finish::StopString(_) => "stop",
        Finish::Length { .. } => "length",
    }
}

async fn collect_response(
    mut rx: mpsc::UnboundedReceiver<GenEvent>,
    mut head: Value,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Delta { text: t, .. } => text.push_str(&t),
            GenEvent::Done { finish, usage, .. } => {
                head["text"] = json!(text);
                head["finish_reason"] = json!(finish_reason(&finish));
                head["usage"] = usage_json(&usage);
                return Ok(Json(head).into_response());
            }
            GenEvent::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the generation ended without a result"))
}

fn stream_response(
    state: &SharedState,
    mut rx: mpsc::UnboundedReceiver<GenEvent>,
    mut head: Value,
) -> Response {
    let (tx, out) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let frame = match ev {
                GenEvent::Delta { text, .. } if text.is_empty() => continue,
                GenEvent::Delta { text, .. } => json!({"text": text}).to_string(),
                GenEvent::Done { finish, usage, .. } => {
                    head["done"] = json!(true);
                    head["finish_reason"] = json!(finish_reason(&finish));
                    head["usage"] = usage_json(&usage);
                    head.to_string()
                }
                GenEvent::Failed(e) => e.body().to_string(),
            };
            if tx.send(frame).is_err() {
                return; // The client left: dropping `rx` cancels the generation.
            }
        }
        let _ = tx.send("[DONE]".into());
    });
    crate::sse::data_stream(out, &state.closing)
}

/// An answer served without generating.
struct Shortcut {
    text: String,
    data_version: u64,
    extra: Value,
}

fn shortcut_response(
    state: &SharedState,
    session: &Session,
    gen_id: &str,
    hit: Shortcut,
    stream: bool,
) -> Response {
    let mut body = json!({
        "id": gen_id,
        "object": "session.generation",
        "session_id": session.id,
        "finish_reason": "stop",
        "data_version": hit.data_version,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
    });
    if let (Some(b), Some(extra)) = (body.as_object_mut(), hit.extra.as_object()) {
        b.extend(extra.clone());
    }
    if !stream {
        body["text"] = json!(hit.text);
        return Json(body).into_response();
    }
    let (tx, out) = mpsc::unbounded_channel::<String>();
    if !hit.text.is_empty() {
        let _ = tx.send(json!({"text": hit.text}).to_string());
    }
    body["done"] = json!(true);
    let _ = tx.send(body.to_string());
    let _ = tx.send("[DONE]".into());
    crate::sse::data_stream(out, &state.closing)
}

struct FlashWanted<'a> {
    flash_id: Option<u64>,
    query: &'a str,
    min_data_version: Option<u64>,
    max_staleness: Option<u64>,
}

/// The cached answer for the asked flash query, if one may be served: a fresh one, a stale one
/// (marked) when the caller set no freshness bound, or one that meets the bound once the
/// evaluation in flight ends. A query with no answer yet waits for the evaluation that is
/// due (it started before this request and costs no more than generating). `None` means
/// generate.
async fn flash_answer(
    state: &SharedState,
    session: &Arc<Session>,
    w: FlashWanted<'_>,
) -> Result<Option<Shortcut>, ApiError> {
    let demanded = w.min_data_version.is_some() || w.max_staleness.is_some();
    let mut progress = session.progress();
    let deadline = tokio::time::Instant::now() + FRESHNESS_WAIT;
    loop {
        // Marked seen before reading the view, so a change after it wakes the wait.
        let ingesting = progress.borrow_and_update().ingesting;
        let (found, due, current) = match session.flash_lookup(w.flash_id, w.query) {
            Lookup::NotRegistered => return Ok(None),
            Lookup::NoSuchId => {
                return Err(ApiError::not_found(format!(
                    "flash query `{}` not found on session `{}`",
                    w.flash_id.unwrap_or(0),
                    session.id
                )))
            }
            Lookup::Found {
                id,
                answer,
                due,
                data_version,
            } => (answer.map(|a| (id, a)), due, data_version),
        };
        let required = w
            .min_data_version
            .unwrap_or(0)
            .max(w.max_staleness.map_or(0, |s| current.saturating_sub(s)));
        match found {
            Some((fid, a)) if !demanded || a.data_version >= required => {
                state.metrics.flash_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(flash_shortcut(state, fid, a, current)));
            }
            _ => {}
        }
        if required > current && !ingesting {
            return Err(version_not_reached(current, required));
        }
        if required <= current && !due {
            // Nothing is coming at this version (no data yet, or the query is parked).
            state.metrics.flash_misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        // Wait for the data to reach the version, or for the evaluation due at it.
        tokio::select! {
            r = tokio::time::timeout_at(deadline, progress.changed()) => if r.is_err() {
                state.metrics.flash_misses.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            },
            _ = session.wait_deleted() => {
                return Err(ApiError::not_found(format!("session `{}` was deleted", session.id)));
            }
        }
    }
}

/// `min_data_version` is ahead of the session and no data is on its way.
fn version_not_reached(current: u64, required: u64) -> ApiError {
    ApiError::invalid(
        "min_data_version",
        format!("the session is at data_version {current} and has no data queued or being ingested; `min_data_version` {required} cannot be reached until more is pushed"),
    )
}

/// Wait, for a generate that is not a flash hit, until the session's data reaches
/// `min_data_version` (while data is queued or being ingested, up to `FRESHNESS_WAIT`).
async fn reach_version(session: &Session, required: u64) -> Result<(), ApiError> {
    let reached = session
        .wait_progress(FRESHNESS_WAIT, |p| {
            p.data_version >= required || !p.ingesting
        })
        .await;
    match reached {
        None => Err(ApiError::not_found(format!(
            "session `{}` was deleted",
            session.id
        ))),
        Some(p) if p.data_version >= required => Ok(()),
        Some(p) if !p.ingesting => Err(version_not_reached(p.data_version, required)),
        Some(p) => Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "timeout_error",
            format!(
                "the session reached data_version {} of the {required} asked for within {} s; retry",
                p.data_version,
                FRESHNESS_WAIT.as_secs()
            ),
        )),
    }
}

fn flash_shortcut(state: &SharedState, fid: u64, a: FlashAnswer, current: u64) -> Shortcut {
    let lag = current.saturating_sub(a.data_version);
    state
        .metrics
        .flash_lag_versions
        .fetch_add(lag, Ordering::Relaxed);
    Shortcut {
        text: a.value,
        data_version: a.data_version,
        extra: json!({"flash": true, "flash_id": fid, "confidence": a.confidence, "lag": lag, "stale": lag > 0}),
    }
}

/// With `pre_decode`: the candidate whose first token is the ready position's top choice, if
/// its logit gap clears the threshold.
async fn speculative(
    state: &SharedState,
    session: &Session,
    candidates: &[String],
    threshold: f32,
) -> Result<Option<Shortcut>, ApiError> {
    let (ready, version) = session.ready().await?;
    let Some((token, gap)) = ready.filter(|(_, g)| *g >= threshold) else {
        return Ok(None);
    };
    let matching: Vec<&String> = (candidates.iter())
        .filter(|c| {
            state
                .tokenizer
                .encode(c, false)
                .ok()
                .and_then(|t| t.first().copied())
                == Some(token)
        })
        .collect();
    let [only] = matching.as_slice() else {
        return Ok(None);
    };
    Ok(Some(Shortcut {
        text: (*only).clone(),
        data_version: version,
        extra: json!({"speculative": true, "logit_gap": gap}),
    }))
}
