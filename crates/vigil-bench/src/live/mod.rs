//! The live-stream workload: a stream of sensor lines pushed every P ms into a session with a
//! W-token window, and a question asked on the same cadence, answered three ways:
//!
//! * flash query: registered up front (`POST …/flash`), asked as a `generate` of the same
//!   prompt, answered from the standing session (sessions only);
//! * cold query: an unannounced question, `generate` with `use_flash: false` (sessions only);
//! * stateless replay: the windowed stream re-sent as a chat completion, rendered as a session
//!   renders a question (docs/sessions.md), on every target. The client keeps its own copy of
//!   the window; on a session target the session is deleted first, so the server holds
//!   nothing for the stream, as a stateless server would not. Consecutive replays share all
//!   but the newest entries, which a server's prompt or prefix cache reuses;
//! * stateless replay, uncached: the same with a first line unique to each request, so no
//!   cache holds the stream (as when other clients' prompts come between, after a restart, or
//!   on another replica).
//!
//! The stream starts full (entries until the window has evicted once) and keeps flowing across
//! the three phases. Queries fall due every P ms, `query_offset_ms` after the pushes (half a
//! period by default: the pusher's ticks anchor every phase's schedule); at most one
//! is in flight, so a query due while the last one runs is sent when it returns and its delay
//! is recorded (`late_ms`): a server slower than the cadence is timed at its own pace under the
//! stream's load, not by a queue that grows with N.

mod agreement;
pub mod entries;
mod load;
mod session;

pub use agreement::Agreement;
pub use entries::{sensor_fields, CountMethod, Entry, EntrySource, TokenCounter, Window};
pub use load::ChatLoad;
pub use session::Session;

use crate::client::Client;
use crate::exec::{self, to_sample};
use crate::result::{Point, Sample};
use crate::stats::Summary;
use crate::workload::{LiveMode, PlannedPoint, Settings, Shape, StreamShape};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

pub const SYSTEM_PROMPT: &str = "You watch a live stream of plant sensor readings, one reading \
     per line, newest last. Answer questions about the readings briefly.";
/// The standing question: registered as the flash query, and what a stateless replay asks.
pub const FLASH_QUESTION: &str =
    "Has any sensor reported status fault? Answer yes or no, then name the sensor.";
/// The unannounced question of the cold phase.
pub const COLD_QUESTION: &str = "Which sensor reported the highest temperature, and what was it?";
/// Entries sized ahead of the stream.
const SIZED_AHEAD: usize = 64;
/// A query sent more than this after it fell due counts as late.
const LATE_MS: f64 = 5.0;
/// With `--chat-streams`, how long the load runs before the first query.
const LOAD_RAMP: Duration = Duration::from_secs(3);
/// Failure messages kept in the record.
const ERRORS_KEPT: usize = 5;
/// Longest the session is given, before it is deleted, to make the pushes acknowledged so far
/// resident (so the residency figures are not cut short by the end of the run).
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// What the stream and the session looked like on one target.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LiveRecord {
    /// The target serves `/v1/sessions` (else only the stateless replay ran).
    pub sessions: bool,
    /// The endpoint entry tokens were counted with.
    pub count_method: String,
    pub system_prompt: String,
    pub flash_question: String,
    pub cold_question: String,
    /// Entries pushed before the first query (the window full, one entry evicted).
    pub fill_entries: u32,
    /// Entries pushed in all, and their token counts.
    pub entries: u32,
    pub entry_tokens: Option<Summary>,
    pub example_entry: String,
    /// Pushes the session refused, and entries it dropped (`overflow`).
    pub push_errors: u64,
    pub dropped_entries: u64,
    /// Pushes that waited for an entry to be sized (the stream fell off its cadence).
    pub stream_stalls: u64,
    pub errors: Vec<String>,
    /// After the fill: the session's retained entries against the client's window.
    pub window_check: Option<WindowCheck>,
    /// Registration → first flash answer.
    pub flash_ready_ms: Option<f64>,
    /// The flash query object at the end of its phase (`evaluations`, `skipped`, `eval_ms`).
    pub flash_query: Option<Value>,
    /// The session object before it was deleted (`window_recomputes`, `evicted`, …).
    pub session_end: Option<Value>,
    /// The chat streams run beside the stream (`--chat-streams`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_load: Option<ChatLoad>,
    /// Ms from each push's ack to its entry being KV-resident (read every 25 ms, so late by at
    /// most that), over the pushes of the phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_ms: Option<Summary>,
    /// Pushes acknowledged before the session's drain began (the run waits up to 30 s, the
    /// stream and the chat load going on, for them to land) and not resident when it was
    /// deleted.
    #[serde(default)]
    pub never_resident: u64,
    /// Each resident push: `[ms from the stream's start to its ack, ms to resident]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resident_timeline: Vec<[f64; 2]>,
    /// The window mode asked for (`--window-mode`), and with `shift` its flash answers'
    /// agreement with exact mode over the stream's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_agreement: Option<Agreement>,
    /// What the replay phases re-sent: `cold-query windows of <target>` (the windows a session
    /// target's cold queries covered, in the same order, so both see the same data) or
    /// `live window` (no session target had run its cold phase yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<String>,
}

/// Whether the client's window is what the session holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowCheck {
    pub client_entries: usize,
    pub server_entries: usize,
    pub client_tokens: u32,
    /// `data_end − prompt_tokens` of the session.
    pub server_tokens: u64,
    pub same_entries: bool,
}

pub struct LiveCtx<'a> {
    pub client: &'a Client,
    pub model: &'a str,
    pub settings: &'a Settings,
    pub name: &'a str,
    /// The windows the first session target's cold queries covered, one per query in order;
    /// every target's replay phases re-send these (see `Stream::replay_window`).
    pub cold_windows: &'a ColdWindows,
}

/// The cold queries' windows, shared between the targets of a run: replays compare with cold
/// queries only at the same held size, and the stream's fill level drifts between phases (it
/// evicts to half the window every few seconds), so a replay phase re-sends the very windows
/// the cold phase saw rather than whatever its own moment holds.
#[derive(Debug, Default)]
pub struct ColdWindows {
    windows: Mutex<Option<(String, Vec<Window>)>>,
}

impl ColdWindows {
    /// Keeps the windows of the first target that offers them.
    fn offer(&self, target: &str, windows: Vec<Window>) {
        if let Ok(mut w) = self.windows.lock() {
            if w.is_none() && !windows.is_empty() {
                *w = Some((target.to_string(), windows));
            }
        }
    }

    /// Query `j`'s window (cycling when a replay phase asks more queries), and whose it was.
    fn get(&self, j: usize) -> Option<(String, Window)> {
        let w = self.windows.lock().ok()?;
        let (target, windows) = w.as_ref()?;
        Some((target.clone(), windows.get(j % windows.len())?.clone()))
    }
}

/// Runs the three phases on one target; their points, in plan order (session phases are left
/// out on a target without sessions).
pub async fn run_target(
    ctx: &LiveCtx<'_>,
    points: &[PlannedPoint],
) -> Result<(LiveRecord, Vec<Point>), BenchError> {
    let Some(Shape::LiveStream { stream: shape, .. }) = points.first().map(|p| p.shape) else {
        return Err(BenchError::Setting("live-stream without points".into()));
    };
    let (client, model) = (ctx.client, ctx.model);
    let counter = TokenCounter::detect(client, model).await?;
    let mut source = EntrySource::new(
        counter,
        ctx.settings.seed,
        shape.period_ms,
        shape.entry_tokens,
    );
    // Half the window, as the server evicts by default, sent explicitly so the client's copy
    // does not depend on a server's default.
    let evict_to = shape.window_tokens / 2;
    let mut window = Window::new(shape.window_tokens, evict_to);
    let mut fill = Vec::new();
    let mut tokens = Vec::new();
    loop {
        let e = source.size_next(client, model).await?;
        fill.push(e.text.clone());
        tokens.push(e.tokens);
        if window.push(e) > 0 {
            break;
        }
    }
    let mut record = LiveRecord {
        count_method: source.method().path().to_string(),
        system_prompt: SYSTEM_PROMPT.into(),
        flash_question: FLASH_QUESTION.into(),
        cold_question: COLD_QUESTION.into(),
        fill_entries: fill.len() as u32,
        example_entry: fill.last().cloned().unwrap_or_default(),
        ..LiveRecord::default()
    };
    let timeout = Duration::from_secs(ctx.settings.request_timeout_s);
    let mode = ctx.settings.window_mode.as_deref();
    let session =
        Session::create_with(client, shape.window_tokens, evict_to, SYSTEM_PROMPT, mode).await?;
    record.window_mode = mode.map(str::to_string);
    let mut flash_id = None;
    if let Some(s) = &session {
        record.sessions = true;
        s.push(&fill).await?;
        let last = fill.last().map_or("", String::as_str);
        let held = s.wait_ingested(last, timeout).await?;
        record.window_check = Some(window_check(s, &window, held).await?);
        let fid = s.add_flash(FLASH_QUESTION, shape.answer_tokens).await?;
        let t0 = Instant::now();
        if s.wait_flash_answer(fid, timeout).await?.is_some() {
            record.flash_ready_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        }
        flash_id = Some(fid);
    }
    eprintln!(
        "[{}] live-stream: {} entries of {} tokens (counted with {}), window {} tokens, {}",
        ctx.name,
        fill.len(),
        shape.entry_tokens,
        record.count_method,
        shape.window_tokens,
        if record.sessions {
            "session and flash query ready"
        } else {
            "no session API: stateless replay only"
        }
    );
    let modes: Vec<&PlannedPoint> = (points.iter())
        .filter(|p| record.sessions || !mode_of(p).needs_sessions())
        .collect();
    let mut ready = VecDeque::new();
    for _ in 0..SIZED_AHEAD {
        ready.push_back(source.size_next(client, model).await?);
    }
    let stream = Stream {
        ctx,
        shape,
        source: tokio::sync::Mutex::new(source),
        ready: Mutex::new(ready),
        sized: Notify::new(),
        taken: Notify::new(),
        tokens: Mutex::new(tokens),
        texts: Mutex::new(fill),
        window: Mutex::new(window),
        session: tokio::sync::Mutex::new(session),
        record: Mutex::new(record),
        stalls: AtomicU64::new(0),
        stop_pusher: Notify::new(),
        stop_sizer: Notify::new(),
        stop_poller: Notify::new(),
        stop_load: Notify::new(),
        residency: load::Residency::default(),
        drained: AtomicU64::new(u64::MAX),
        push_epoch: Instant::now() + Duration::from_millis(u64::from(shape.period_ms)),
    };
    let streams = ctx.settings.chat_streams;
    let started = Instant::now();
    let phases = async {
        if streams > 0 {
            // Every chat stream has a request in the engine before the first query is due.
            tokio::time::sleep(LOAD_RAMP).await;
        }
        let r = stream.phases(&modes, flash_id).await;
        stream.stop_pusher.notify_one();
        stream.stop_sizer.notify_one();
        stream.stop_poller.notify_one();
        stream.stop_load.notify_one();
        r
    };
    let chat_load = async {
        if streams == 0 {
            return None;
        }
        let seed = ctx.settings.seed;
        Some(load::run_chat_load(client, model, streams, seed, &stream.stop_load).await)
    };
    let ((), (), (), chat_load, measured) = tokio::join!(
        stream.sizer(),
        stream.pusher(),
        stream.poller(),
        chat_load,
        phases
    );
    // A phase that failed may leave the session behind: delete it, best effort.
    if let Some(s) = stream.session.lock().await.take() {
        let _ = s.delete().await;
    }
    let measured = measured?;
    let mut record = stream.record.into_inner().unwrap_or_default();
    let tokens = stream.tokens.into_inner().unwrap_or_default();
    record.entries = tokens.len() as u32;
    record.entry_tokens = Summary::of(tokens.iter().map(|&n| f64::from(n)));
    record.stream_stalls = stream.stalls.load(Ordering::Relaxed);
    if record.sessions {
        (
            record.resident_ms,
            record.never_resident,
            record.resident_timeline,
        ) = (stream.residency).summary(started, stream.drained.load(Ordering::Relaxed));
    }
    record.chat_load = chat_load;
    if record.sessions && mode == Some("shift") {
        let texts = stream.texts.into_inner().unwrap_or_default();
        eprintln!(
            "[{}] live-stream: shift-mode answer agreement over {} entries",
            ctx.name,
            texts.len()
        );
        let twin = agreement::Twin {
            client,
            window: shape.window_tokens,
            evict_to,
            answer_tokens: shape.answer_tokens,
            timeout,
        };
        match twin.run(&texts).await {
            Ok(a) => record.window_agreement = Some(a),
            Err(e) => record.errors.push(format!("window agreement: {e}")),
        }
    }
    Ok((record, measured))
}

fn mode_of(p: &PlannedPoint) -> LiveMode {
    match p.shape {
        Shape::LiveStream { mode, .. } => mode,
        _ => LiveMode::Replay,
    }
}

async fn window_check(
    s: &Session,
    window: &Window,
    server: Vec<String>,
) -> Result<WindowCheck, BenchError> {
    let state = s.get().await?;
    let n = |k: &str| state.get(k).and_then(Value::as_u64).unwrap_or(0);
    let client = window.texts();
    Ok(WindowCheck {
        client_entries: client.len(),
        server_entries: server.len(),
        client_tokens: window.tokens(),
        server_tokens: n("data_end").saturating_sub(n("prompt_tokens")),
        same_entries: client == server,
    })
}

/// The stream while it flows: the pusher and the phases share it.
struct Stream<'a> {
    ctx: &'a LiveCtx<'a>,
    shape: StreamShape,
    /// Sizes entries ahead of the pusher (a target that serves one request at a time may take
    /// seconds to answer a count), so the stream keeps its cadence.
    source: tokio::sync::Mutex<EntrySource>,
    ready: Mutex<VecDeque<Entry>>,
    sized: Notify,
    taken: Notify,
    /// Token counts and texts of every entry pushed, in order.
    tokens: Mutex<Vec<u32>>,
    texts: Mutex<Vec<String>>,
    window: Mutex<Window>,
    /// The session the pusher pushes to; taken out (and deleted) before the replay phase.
    session: tokio::sync::Mutex<Option<Session>>,
    record: Mutex<LiveRecord>,
    /// Pushes that found no sized entry ready and waited for one.
    stalls: AtomicU64,
    stop_pusher: Notify,
    stop_sizer: Notify,
    stop_poller: Notify,
    stop_load: Notify,
    /// When each push of the phases became KV-resident.
    residency: load::Residency,
    /// The newest push acknowledged when the session's drain began (see `drain`).
    drained: AtomicU64,
    /// The pusher's first tick; it pushes every period from here, and queries fall due
    /// `query_offset_ms` after its ticks.
    push_epoch: Instant,
}

impl Stream<'_> {
    fn note(&self, what: String) {
        if let Ok(mut r) = self.record.lock() {
            if r.errors.len() < ERRORS_KEPT {
                r.errors.push(what);
            }
        }
    }

    fn period(&self) -> Duration {
        Duration::from_millis(u64::from(self.shape.period_ms))
    }

    /// The first instant at or after `now` that is `query_offset_ms` after one of the pusher's
    /// ticks, so every phase's queries keep the same place relative to the pushes.
    fn first_due(&self, now: Instant) -> Instant {
        let offset = Duration::from_millis(u64::from(self.shape.query_offset_ms));
        let period = self.period().as_nanos().max(1);
        let anchor = self.push_epoch + offset;
        if now <= anchor {
            return anchor;
        }
        let periods = (now - anchor).as_nanos().div_ceil(period);
        anchor + Duration::from_nanos((periods * period) as u64)
    }

    /// Keeps `SIZED_AHEAD` entries sized and ready until the phases end.
    async fn sizer(&self) {
        let (client, model) = (self.ctx.client, self.ctx.model);
        loop {
            let room = self.ready.lock().is_ok_and(|r| r.len() < SIZED_AHEAD);
            if !room {
                tokio::select! {
                    _ = self.taken.notified() => continue,
                    _ = self.stop_sizer.notified() => return,
                }
            }
            let sized = tokio::select! {
                e = async { self.source.lock().await.size_next(client, model).await } => e,
                _ = self.stop_sizer.notified() => return,
            };
            match sized {
                Ok(e) => {
                    if let Ok(mut r) = self.ready.lock() {
                        r.push_back(e);
                    }
                    self.sized.notify_one();
                }
                Err(e) => {
                    self.note(format!("sizing an entry: {e}"));
                    tokio::time::sleep(self.period()).await;
                }
            }
        }
    }

    /// One entry every period until the phases end: into the client's window, and pushed to
    /// the session while there is one.
    async fn pusher(&self) {
        let start = tokio::time::Instant::from_std(self.push_epoch);
        let mut tick = tokio::time::interval_at(start, self.period());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.stop_pusher.notified() => return,
            }
            let entry = loop {
                if let Some(e) = self.ready.lock().ok().and_then(|mut r| r.pop_front()) {
                    break e;
                }
                self.stalls.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    _ = self.sized.notified() => {}
                    _ = self.stop_pusher.notified() => return,
                }
            };
            self.taken.notify_one();
            let session = self.session.lock().await;
            if let Ok(mut w) = self.window.lock() {
                w.push(entry.clone());
            }
            if let Ok(mut t) = self.tokens.lock() {
                t.push(entry.tokens);
            }
            if let Ok(mut t) = self.texts.lock() {
                t.push(entry.text.clone());
            }
            let Some(s) = session.as_ref() else { continue };
            let ack = s.push(std::slice::from_ref(&entry.text)).await;
            if let Ok(mut r) = self.record.lock() {
                match ack {
                    Ok(a) => {
                        r.dropped_entries += a.get("dropped").and_then(Value::as_u64).unwrap_or(0);
                        if let Some(k) = a.get("total_pushed").and_then(Value::as_u64) {
                            self.residency.ack(k, Instant::now());
                        }
                    }
                    Err(e) => {
                        r.push_errors += 1;
                        if r.errors.len() < ERRORS_KEPT {
                            r.errors.push(format!("push: {e}"));
                        }
                    }
                }
            }
        }
    }

    /// Reads how many entries the session made resident every `load::POLL` while there is one.
    async fn poller(&self) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(load::POLL) => {}
                _ = self.stop_poller.notified() => return,
            }
            let Some(s) = self.session.lock().await.clone() else {
                continue;
            };
            if let Ok(Some(n)) = s.ingested().await {
                self.residency.saw(n, Instant::now());
            }
        }
    }

    async fn phases(
        &self,
        points: &[&PlannedPoint],
        flash_id: Option<u64>,
    ) -> Result<Vec<Point>, BenchError> {
        let mut out = Vec::new();
        for point in points {
            let mode = mode_of(point);
            let session = self.session.lock().await.clone();
            if !mode.needs_sessions() {
                // Stateless from here: the server keeps nothing for the stream.
                self.drain().await;
                if let Some(s) = self.session.lock().await.take() {
                    let end = s.get().await?;
                    s.delete().await?;
                    if let Ok(mut r) = self.record.lock() {
                        r.session_end = Some(end);
                    }
                }
            }
            out.push(self.phase(point, mode, session.as_ref(), flash_id).await?);
            if let (LiveMode::Flash, Some(s), Some(fid)) = (mode, &session, flash_id) {
                // The cold phase then measures the cold path alone, with no evaluations
                // competing for the engine.
                let q = s.flash(fid).await?;
                s.delete_flash(fid).await?;
                if let Ok(mut r) = self.record.lock() {
                    r.flash_query = Some(q);
                }
            }
        }
        if self.session.lock().await.is_some() {
            self.drain().await;
        }
        Ok(out)
    }

    /// Before the session goes: wait (at most `DRAIN_WAIT`; the pusher and any chat load go
    /// on) until every push acknowledged so far is resident, and remember how far that was.
    async fn drain(&self) {
        let k = self.residency.last_acked();
        let until = Instant::now() + DRAIN_WAIT;
        while k > 0 && !self.residency.covers(k) && Instant::now() < until {
            tokio::time::sleep(load::POLL).await;
        }
        self.drained.fetch_min(k, Ordering::Relaxed);
    }

    async fn phase(
        &self,
        point: &PlannedPoint,
        mode: LiveMode,
        session: Option<&Session>,
        flash_id: Option<u64>,
    ) -> Result<Point, BenchError> {
        let settings = self.ctx.settings;
        let (warm, measured) = (settings.warmup, point.measured_requests(settings));
        eprintln!(
            "[{}] live-stream {}: {} queries ({warm} warm-up), one due every {} ms",
            self.ctx.name,
            point.label,
            warm + measured,
            self.shape.period_ms
        );
        let t0 = Instant::now();
        let mut measured_from = t0;
        let mut samples = Vec::new();
        let mut cold_windows = Vec::new();
        let first = self.first_due(t0);
        for j in 0..warm + measured {
            let due = first + self.period() * j;
            tokio::time::sleep_until(due.into()).await;
            let sent = Instant::now();
            if j == warm {
                measured_from = sent;
            }
            let mut s = match (mode, session) {
                (LiveMode::Flash, Some(s)) => self.ask_flash(s, flash_id, t0).await,
                (LiveMode::Cold, Some(s)) => {
                    let w = self.window.lock().map(|w| w.clone()).ok();
                    let mut x = self.ask_cold(s, t0).await;
                    if let Some(w) = w {
                        (x.window_entries, x.held_tokens) =
                            (Some(w.len() as u32), Some(w.tokens()));
                        cold_windows.push(w);
                    }
                    x
                }
                (LiveMode::Replay, _) => self.ask_replay(t0, false, j as usize).await,
                (LiveMode::ReplayUncached, _) => self.ask_replay(t0, true, j as usize).await,
                (_, None) => {
                    return Err(BenchError::Setting(format!(
                        "{} needs a session",
                        point.label
                    )))
                }
            };
            s.warmup = j < warm;
            s.iteration = j;
            s.late_ms = Some(ms(due, sent));
            samples.push(s);
        }
        let wall_s = measured_from.elapsed().as_secs_f64();
        self.ctx.cold_windows.offer(self.ctx.name, cold_windows);
        let p = exec::summarize(point, samples, wall_s, warm, measured);
        report_phase(self.ctx.name, &p);
        Ok(p)
    }

    async fn ask_flash(&self, s: &Session, flash_id: Option<u64>, t0: Instant) -> Sample {
        let a = self.shape.answer_tokens;
        let body = json!({"prompt": FLASH_QUESTION, "max_tokens": a, "temperature": 0});
        let start = Instant::now();
        let reply = self.ctx.client.post_json(&s.path("/generate"), &body).await;
        let mut x = plain_sample(t0, start, Instant::now(), a);
        match reply {
            Ok(v) => {
                let hit = v.get("flash") == Some(&Value::Bool(true));
                x.flash = Some(hit);
                x.lag = v.get("lag").and_then(Value::as_u64);
                x.stale = v.get("stale").and_then(Value::as_bool);
                x.data_version = v.get("data_version").and_then(Value::as_u64);
                x.finish_reason = v
                    .get("finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let served = v.get("flash_id").and_then(Value::as_u64);
                if hit && served != flash_id {
                    x.error = Some(format!(
                        "answered from flash query {served:?}, not {flash_id:?}"
                    ));
                }
                if !hit {
                    // Generated cold: it ran the question and counts like one.
                    let usage =
                        crate::client::Usage::from_json(v.get("usage").unwrap_or(&Value::Null));
                    x.prompt_tokens = usage.prompt_tokens;
                    x.cached_tokens = usage.cached_tokens;
                    x.output_tokens = usage.completion_tokens;
                }
            }
            Err(e) => x.error = Some(e.to_string()),
        }
        x
    }

    async fn ask_cold(&self, s: &Session, t0: Instant) -> Sample {
        let a = self.shape.answer_tokens;
        let body = json!({
            "prompt": COLD_QUESTION, "max_tokens": a, "temperature": 0,
            "use_flash": false, "ignore_eos": true, "stream": true,
        });
        let streamed = self.ctx.client.stream(&s.path("/generate"), &body).await;
        to_sample(&streamed, t0, 0, None, a, false)
    }

    /// The window replay query `j` re-sends: the `j`th cold query's (see `ColdWindows`), or
    /// the live one when no session target ran its cold phase before.
    fn replay_window(&self, j: usize) -> Window {
        let (from, w) = match self.ctx.cold_windows.get(j) {
            Some((target, w)) => (format!("cold-query windows of {target}"), w),
            None => {
                let w = self.window.lock().map(|w| w.clone());
                let empty = Window::new(self.shape.window_tokens, 0);
                ("live window".to_string(), w.unwrap_or(empty))
            }
        };
        if let Ok(mut r) = self.record.lock() {
            r.replayed.get_or_insert(from);
        }
        w
    }

    /// `uncached`: the system prompt opens with a line unique to this request, so no cache
    /// holds any of the prompt past the template's first few tokens.
    async fn ask_replay(&self, t0: Instant, uncached: bool, j: usize) -> Sample {
        let a = self.shape.answer_tokens;
        let w = self.replay_window(j);
        let (content, n, held) = (w.user_content(FLASH_QUESTION), w.len(), w.tokens());
        let system = if uncached {
            // Mixed so that even the first digits differ between requests.
            let nonce = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            format!("{nonce:016x}\n{SYSTEM_PROMPT}")
        } else {
            SYSTEM_PROMPT.to_string()
        };
        let messages = [
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": content}),
        ];
        let body = crate::run::chat_body(self.ctx.model, &messages, a, true);
        let streamed = self.ctx.client.stream("/v1/chat/completions", &body).await;
        let mut x = to_sample(&streamed, t0, 0, None, a, false);
        (x.window_entries, x.held_tokens) = (Some(n as u32), Some(held));
        x
    }
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e3
}

/// A sample of a request answered in one JSON body (no stream, so no first-token time).
fn plain_sample(t0: Instant, start: Instant, end: Instant, requested: u32) -> Sample {
    Sample {
        start_ms: ms(t0, start),
        e2e_ms: ms(start, end),
        requested_tokens: requested,
        ..Sample::default()
    }
}

/// Live-stream aggregates over a point's measured, successful samples: flash hit rate, mean
/// lag and stale rate of the answers served from flash, and how many queries went out late.
pub fn aggregates(ok: &[&Sample], out: &mut BTreeMap<String, f64>) {
    let flash: Vec<&&Sample> = ok.iter().filter(|s| s.flash.is_some()).collect();
    if !flash.is_empty() {
        let hits: Vec<&&&Sample> = flash.iter().filter(|s| s.flash == Some(true)).collect();
        out.insert(
            "flash_hit_rate".into(),
            hits.len() as f64 / flash.len() as f64,
        );
        let lags: Vec<f64> = hits
            .iter()
            .filter_map(|s| s.lag)
            .map(|l| l as f64)
            .collect();
        if !lags.is_empty() {
            out.insert(
                "mean_lag".into(),
                lags.iter().sum::<f64>() / lags.len() as f64,
            );
            let stale = hits.iter().filter(|s| s.stale == Some(true)).count();
            out.insert("stale_rate".into(), stale as f64 / hits.len() as f64);
        }
    }
    let late: Vec<f64> = ok.iter().filter_map(|s| s.late_ms).collect();
    if !late.is_empty() {
        let n = late.iter().filter(|&&l| l > LATE_MS).count();
        out.insert("late_queries".into(), n as f64);
        out.insert(
            "max_late_ms".into(),
            late.iter().copied().fold(0.0, f64::max),
        );
    }
}

fn report_phase(name: &str, p: &Point) {
    let m = |k: &str| p.metrics.get(k).map_or(f64::NAN, |s| s.p50);
    let a = |k: &str| p.throughput.get(k).copied();
    let mut line = format!(
        "[{name}] live-stream {}: {}; e2e p50 {:.2} ms",
        p.label,
        if p.excluded {
            format!("EXCLUDED ({} failed)", p.failed)
        } else {
            "ok".into()
        },
        m("e2e_ms")
    );
    if p.metrics.contains_key("ttft_ms") {
        line.push_str(&format!(", TTFT p50 {:.1} ms", m("ttft_ms")));
    }
    if let Some(h) = a("flash_hit_rate") {
        line.push_str(&format!(", flash hits {:.0}%", h * 100.0));
    }
    if let Some(l) = a("mean_lag") {
        line.push_str(&format!(", mean lag {l:.2}"));
    }
    if let Some(n) = a("late_queries").filter(|&n| n > 0.0) {
        line.push_str(&format!(
            ", {n} sent late (up to {:.0} ms)",
            a("max_late_ms").unwrap_or(0.0)
        ));
    }
    eprintln!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(flash: Option<bool>, lag: Option<u64>, late: f64) -> Sample {
        let t = Instant::now();
        let mut s = plain_sample(t, t, t, 16);
        s.flash = flash;
        s.lag = lag;
        s.stale = lag.map(|l| l > 0);
        s.late_ms = Some(late);
        s
    }

    #[test]
    fn aggregates_count_hits_lag_and_late_queries() {
        let v = [
            sample(Some(true), Some(0), 0.3),
            sample(Some(true), Some(2), 1200.0),
            sample(Some(false), None, 0.5),
            sample(Some(true), Some(1), 6.0),
        ];
        let refs: Vec<&Sample> = v.iter().collect();
        let mut out = BTreeMap::new();
        aggregates(&refs, &mut out);
        assert!((out["flash_hit_rate"] - 0.75).abs() < 1e-9);
        assert!((out["mean_lag"] - 1.0).abs() < 1e-9);
        assert!((out["stale_rate"] - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(out["late_queries"], 2.0);
        assert_eq!(out["max_late_ms"], 1200.0);
        // A replay has no flash fields: no hit rate.
        let replay = [sample(None, None, 0.0)];
        let mut out = BTreeMap::new();
        aggregates(&replay.iter().collect::<Vec<_>>(), &mut out);
        assert!(!out.contains_key("flash_hit_rate"));
        assert_eq!(out["late_queries"], 0.0);
    }
}
