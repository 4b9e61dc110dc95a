//! One session: its settings, its durable context (the token mirror, as an opening plus data
//! entries), its pending queue and counters, its flash queries, and the JSON it reports.
//!
//! Locking: `state` is a plain mutex held only for quick reads and updates, never across an
//! await. `writer` serializes whatever rewrites the durable context (an ingest batch, an agent
//! turn, a warm turn), so each one starts from the context the previous one left.

use super::events::EventBus;
use super::flash::FlashQuery;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::{watch, Notify};
use vigil_engine::pins::PinKey;

/// What a full pending queue does with a new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Drop the oldest unprocessed entries (LayerScale's behaviour), reported as `dropped`.
    DropOldest,
    /// Refuse the push with 429; nothing is dropped.
    Reject,
}

#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub window: Option<usize>,
    /// When the data exceeds `window`, evict down to this many tokens (≤ `window`): each
    /// recompute then buys room for `window - evict_to` tokens of new data.
    pub evict_to: Option<usize>,
    pub pre_decode: bool,
    pub prompt: Option<String>,
    pub overflow: Overflow,
    pub max_pending: usize,
    pub max_pending_bytes: usize,
    /// How a question is wrapped at each layout (default template settings).
    pub wraps: super::layout::Wraps,
}

/// Where the durable context ends, which decides how a question is appended. A new session
/// starts with its opening, an open user turn: `Data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Inside an open user turn holding the data: a question completes that turn.
    Data,
    /// After a closed turn (an agent reply, a warmed prompt): a question opens a new turn.
    Chat,
}

/// One pushed entry: its text and its tokens (`text + "\n"`, tokenized when pushed).
#[derive(Debug, Clone)]
pub struct Entry {
    pub text: String,
    pub tokens: Vec<u32>,
    /// When it was queued (its push's ack): ingest bounds how long it waits on flash queries.
    pub queued: Instant,
}

pub struct SessionState {
    /// Tokens before the data region: the opening, or a conversation plus a new user turn.
    pub base: Vec<u32>,
    /// Tokens of the opening (the template head with the pinned `prompt`), which the window
    /// never evicts.
    pub opening_len: usize,
    pub entries: VecDeque<Entry>,
    pub data_tokens: usize,
    pub layout: Layout,
    /// The opening is in the mirror but not yet KV-resident (a new session).
    pub opening_due: bool,
    pub data_version: u64,
    pub pending: VecDeque<Entry>,
    pub pending_bytes: usize,
    pub total_pushed: u64,
    pub total_dropped: u64,
    /// Entries made KV-resident so far (every batch that landed): a client that counted its
    /// pushes (`total_pushed` of each ack) knows each one is resident once this reaches it.
    pub total_ingested: u64,
    pub evicted: u64,
    pub evicted_tokens: u64,
    pub window_recomputes: u64,
    pub turns: u64,
    pub last_used_unix: u64,
    pub last_used: Instant,
    /// Foreground requests in flight (generates and turns).
    pub foreground: usize,
    pub turn_active: bool,
    /// Cancels the warm turn in flight, if any.
    pub warm_cancel: Option<watch::Sender<bool>>,
    /// Event streams attached (an attached session never expires).
    pub subscribers: usize,
    /// The next-token choice at the durable end (with `pre_decode`): token and logit gap.
    pub ready: Option<(u32, f32)>,
    pub flash: Vec<FlashQuery>,
    pub next_flash_id: u64,
}

impl SessionState {
    /// The durable context: base then every retained entry.
    pub fn mirror(&self) -> Vec<u32> {
        let mut m = Vec::with_capacity(self.base.len() + self.data_tokens);
        m.extend_from_slice(&self.base);
        for e in &self.entries {
            m.extend_from_slice(&e.tokens);
        }
        m
    }

    pub fn data_end(&self) -> usize {
        self.base.len() + self.data_tokens
    }

    pub fn pending_tokens(&self) -> usize {
        self.pending.iter().map(|e| e.tokens.len()).sum()
    }

    pub fn touch(&mut self) {
        self.last_used = Instant::now();
        self.last_used_unix = crate::ids::unix_now();
    }

    pub fn busy(&self) -> bool {
        self.foreground > 0 || self.turn_active
    }
}

pub struct Session {
    pub id: String,
    pub pin: PinKey,
    pub created: u64,
    /// Creation time in milliseconds, for the listing order.
    pub created_ms: u128,
    pub settings: SessionSettings,
    /// The opening's tokens (template head, with `prompt` as the system message).
    pub opening_tokens: Vec<u32>,
    pub state: Mutex<SessionState>,
    pub writer: std::sync::Arc<tokio::sync::Mutex<()>>,
    pub events: EventBus,
    /// Wakes the ingest worker (new entries, or deletion).
    pub ingest_wake: Notify,
    /// Wakes the flash evaluator (a new version or query, or deletion).
    pub flash_wake: Notify,
    /// Tells waiters a flash evaluation round ended.
    pub flash_done: watch::Sender<u64>,
    pub deleted: AtomicBool,
    /// Set with `deleted`, for tasks that wait on it.
    gone: watch::Sender<bool>,
}

impl Session {
    pub fn new(
        id: String,
        pin: PinKey,
        settings: SessionSettings,
        opening_tokens: Vec<u32>,
    ) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let opening_len = opening_tokens.len();
        Session {
            id,
            pin,
            created: (now / 1000) as u64,
            created_ms: now,
            settings,
            opening_tokens: opening_tokens.clone(),
            state: Mutex::new(SessionState {
                base: opening_tokens,
                opening_len,
                entries: VecDeque::new(),
                data_tokens: 0,
                layout: Layout::Data,
                opening_due: true,
                data_version: 0,
                pending: VecDeque::new(),
                pending_bytes: 0,
                total_pushed: 0,
                total_dropped: 0,
                total_ingested: 0,
                evicted: 0,
                evicted_tokens: 0,
                window_recomputes: 0,
                turns: 0,
                last_used_unix: (now / 1000) as u64,
                last_used: Instant::now(),
                foreground: 0,
                turn_active: false,
                warm_cancel: None,
                subscribers: 0,
                ready: None,
                flash: Vec::new(),
                next_flash_id: 1,
            }),
            writer: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            events: EventBus::new(),
            ingest_wake: Notify::new(),
            flash_wake: Notify::new(),
            flash_done: watch::channel(0).0,
            deleted: AtomicBool::new(false),
            gone: watch::channel(false).0,
        }
    }

    /// Mark deleted and wake every task that serves the session so it can end.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.gone.send_replace(true);
        self.ingest_wake.notify_one();
        self.flash_wake.notify_one();
        if let Some(c) = self.lock().warm_cancel.take() {
            let _ = c.send(true);
        }
    }

    /// Resolves once the session is deleted.
    pub async fn wait_deleted(&self) {
        let mut rx = self.gone.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// The state, even if a panicking holder poisoned the lock (the data stays consistent:
    /// every update is a few assignments).
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// The client's `Session` object, plus Vigil's counters. `last_used` is the value before
    /// this call touched the session.
    pub fn to_json(&self, kv_tokens: usize, last_used: u64) -> Value {
        let st = self.lock();
        let data_end = st.data_end();
        let mut v = json!({
            "id": self.id,
            "object": "session",
            "created": self.created,
            "last_used": last_used,
            "tokens": data_end,
            "kv_tokens": kv_tokens.min(data_end),
            "busy": st.busy(),
            "turns": st.turns,
            "data_end": data_end,
            "data_version": st.data_version,
            "pending": st.pending.len(),
            "pre_decode": self.settings.pre_decode,
            "ready": self.settings.pre_decode && st.ready.is_some(),
            "evicted": st.evicted,
            "prompt_tokens": st.opening_len,
            "overflow": self.settings.overflow,
            "max_pending": self.settings.max_pending,
            "max_pending_bytes": self.settings.max_pending_bytes,
            "pending_bytes": st.pending_bytes,
            "total_pushed": st.total_pushed,
            "total_dropped": st.total_dropped,
            "total_ingested": st.total_ingested,
            "evicted_tokens": st.evicted_tokens,
            "window_recomputes": st.window_recomputes,
            "flash_queries": st.flash.len(),
            "subscribers": st.subscribers,
        });
        if let Some(w) = self.settings.window {
            v["window"] = json!(w);
            v["evict_to"] = json!(self.settings.evict_to.unwrap_or(w));
        }
        if st.opening_len > 0 {
            v["frozen_end"] = json!(st.opening_len);
        }
        if let (true, Some((token, gap))) = (self.settings.pre_decode, st.ready) {
            v["ready_token"] = json!(token);
            v["ready_gap"] = json!(gap);
        }
        v
    }
}
