//! One session's state: its settings, its durable context (the token mirror, as an opening
//! plus data entries), its pending queue and counters, its flash queries, and the JSON it
//! reports. The session's actor (`actor.rs`) owns it as plain data; nothing else touches it.

use super::flash::FlashQuery;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::time::Instant;

/// What a full pending queue does with a new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Drop the oldest unprocessed entries (LayerScale's behaviour), reported as `dropped`.
    DropOldest,
    /// Refuse the push with 429; nothing is dropped.
    Reject,
}

/// How a window drops its oldest entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowMode {
    /// Recompute the retained entries from the opening: answers are exactly a fresh
    /// session's holding those entries.
    #[default]
    Exact,
    /// Approximate (llama.cpp's context shift): keep the retained entries' KV and re-rotate
    /// their keys to their new positions; no recompute, but the kept KV still saw the evicted
    /// entries, so answers may differ from exact mode's.
    Shift,
}

/// How a session was created (its settings before anything is tokenized).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionParams {
    pub window: Option<usize>,
    /// When the data exceeds `window`, evict down to this many tokens (≤ `window`): each
    /// recompute then buys room for `window - evict_to` tokens of new data.
    pub evict_to: Option<usize>,
    pub window_mode: WindowMode,
    pub pre_decode: bool,
    pub prompt: Option<String>,
    pub overflow: Overflow,
    pub max_pending: usize,
    pub max_pending_bytes: usize,
}

/// A session's settings: as created, and the template's tokens around its data.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub params: SessionParams,
    /// How a question is wrapped at each layout (default template settings).
    pub wraps: super::layout::Wraps,
    /// Tokens of the opening (the template head with the pinned `prompt`).
    pub opening: Vec<u32>,
    /// Tokens that open a new user turn for data after a closed turn.
    pub chat_data_prefix: Vec<u32>,
    /// Tokens of the generation prompt after the data (the `pre_decode` ready position).
    pub ready_suffix: Vec<u32>,
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
    /// Evictions done by position shift (`WindowMode::Shift`) instead of recompute.
    pub window_shifts: u64,
    pub turns: u64,
    pub last_used_unix: u64,
    pub last_used: Instant,
    /// Foreground requests in flight (generates and turns).
    pub foreground: usize,
    pub turn_active: bool,
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

    pub fn new(opening: Vec<u32>) -> Self {
        let now = crate::ids::unix_now();
        SessionState {
            opening_len: opening.len(),
            base: opening,
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
            window_shifts: 0,
            turns: 0,
            last_used_unix: now,
            last_used: Instant::now(),
            foreground: 0,
            turn_active: false,
            subscribers: 0,
            ready: None,
            flash: Vec::new(),
            next_flash_id: 1,
        }
    }

    /// The client's `Session` object, plus Vigil's counters. `last_used` is the value before
    /// the request that asks touched the session.
    pub fn to_json(
        &self,
        head: &Identity,
        s: &SessionSettings,
        kv: usize,
        last_used: u64,
    ) -> Value {
        let s = &s.params;
        let data_end = self.data_end();
        let mut v = json!({
            "id": head.id,
            "object": "session",
            "created": head.created,
            "last_used": last_used,
            "tokens": data_end,
            "kv_tokens": kv.min(data_end),
            "busy": self.busy(),
            "turns": self.turns,
            "data_end": data_end,
            "data_version": self.data_version,
            "pending": self.pending.len(),
            "pre_decode": s.pre_decode,
            "ready": s.pre_decode && self.ready.is_some(),
            "evicted": self.evicted,
            "prompt_tokens": self.opening_len,
            "overflow": s.overflow,
            "max_pending": s.max_pending,
            "max_pending_bytes": s.max_pending_bytes,
            "pending_bytes": self.pending_bytes,
            "total_pushed": self.total_pushed,
            "total_dropped": self.total_dropped,
            "total_ingested": self.total_ingested,
            "evicted_tokens": self.evicted_tokens,
            "window_recomputes": self.window_recomputes,
            "flash_queries": self.flash.len(),
            "subscribers": self.subscribers,
        });
        if let Some(w) = s.window {
            v["window"] = json!(w);
            v["evict_to"] = json!(s.evict_to.unwrap_or(w));
            v["window_mode"] = json!(s.window_mode);
            v["window_shifts"] = json!(self.window_shifts);
        }
        if self.opening_len > 0 {
            v["frozen_end"] = json!(self.opening_len);
        }
        if let (true, Some((token, gap))) = (s.pre_decode, self.ready) {
            v["ready_token"] = json!(token);
            v["ready_gap"] = json!(gap);
        }
        v
    }

    /// The retained entries, in order (what the session's KV holds as data).
    pub fn data_json(&self) -> Value {
        let entries: Vec<&str> = self.entries.iter().map(|e| e.text.as_str()).collect();
        json!({
            "object": "session.data",
            "entries": entries,
            "evicted": self.evicted,
            "data_version": self.data_version,
            "data_end": self.data_end(),
            "pending": self.pending.len(),
        })
    }
}

/// What names a session: fixed at creation, held by its handle and its actor.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: String,
    pub pin: vigil_engine::pins::PinKey,
    /// Creation time, in seconds and (for the listing order) milliseconds.
    pub created: u64,
    pub created_ms: u128,
}

impl Identity {
    pub fn new(id: String, pin: vigil_engine::pins::PinKey) -> Self {
        Self::at(id, pin, crate::ids::unix_now_ms())
    }

    /// A session created at `ms` (milliseconds since the epoch): a restored one keeps its time.
    pub fn at(id: String, pin: vigil_engine::pins::PinKey, ms: u128) -> Self {
        Identity {
            id,
            pin,
            created: (ms / 1000) as u64,
            created_ms: ms,
        }
    }
}
