//! What the journal knows of each session, and the fold that builds it: every record is an
//! operation on one session, and applying the records in log order rebuilds exactly what was
//! acknowledged. The writer thread keeps this model current as it logs (so a snapshot or an
//! export is its serialization), and a restart replays a snapshot and the log through the same
//! `apply`.
//!
//! Entry texts, not tokens, are kept: tokens are derived again on restore (the model is
//! checked to be the same one). A session's data moves pending → in flight (an ingest batch
//! taken) → retained (the batch landed) exactly as the actor moves it, so an overflow drop
//! replays onto the same entries it dropped.

pub use crate::session::state::SessionParams;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A registered flash query and its newest answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlashRecord {
    pub id: u64,
    pub query: String,
    pub max_tokens: usize,
    /// Restored as the cached answer; a query whose answer is older than the restored data
    /// is evaluated again once the KV is rebuilt.
    #[serde(default)]
    pub answer: Option<AnswerRecord>,
}

/// A flash answer as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRecord {
    pub value: String,
    pub ids: Vec<u32>,
    /// It ended on a stop token (else at `max_tokens`).
    pub stopped: bool,
    pub data_version: u64,
    pub confidence: f32,
    pub evaluated_at: u64,
}

/// One session as the journal holds it: everything needed to recreate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DurableSession {
    pub id: String,
    pub created_ms: u64,
    pub params: SessionParams,
    /// Tokens before the data when they are not the opening: a conversation (after a turn or
    /// a warm), or a conversation and the user turn opened for data after it.
    pub base: Option<Vec<u32>>,
    /// The context ends after a closed turn (`Layout::Chat`).
    pub chat_layout: bool,
    /// Entries in the KV, oldest first.
    pub entries: VecDeque<String>,
    /// Entries of the ingest batch in flight (pending again on restore).
    pub in_flight: VecDeque<String>,
    pub pending: VecDeque<String>,
    pub data_version: u64,
    pub total_pushed: u64,
    pub total_dropped: u64,
    pub total_ingested: u64,
    pub evicted: u64,
    pub evicted_tokens: u64,
    pub window_recomputes: u64,
    pub window_shifts: u64,
    pub turns: u64,
    pub flash: Vec<FlashRecord>,
    pub next_flash_id: u64,
    /// Event ids below this may have been sent: a restored session numbers from here, so a
    /// client's `Last-Event-ID` still orders its events.
    pub next_event_id: u64,
}

impl DurableSession {
    pub fn new(id: String, created_ms: u64, params: SessionParams) -> Self {
        DurableSession {
            id,
            created_ms,
            params,
            base: None,
            chat_layout: false,
            entries: VecDeque::new(),
            in_flight: VecDeque::new(),
            pending: VecDeque::new(),
            data_version: 0,
            total_pushed: 0,
            total_dropped: 0,
            total_ingested: 0,
            evicted: 0,
            evicted_tokens: 0,
            window_recomputes: 0,
            window_shifts: 0,
            turns: 0,
            flash: Vec::new(),
            next_flash_id: 1,
            next_event_id: 1,
        }
    }
}

/// One operation on one session, as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Create {
        created_ms: u64,
        params: SessionParams,
    },
    /// A whole session arrives (an import). (Not `session`: the record's own field.)
    Import {
        state: Box<DurableSession>,
    },
    /// Entries queued; then the `dropped` oldest pending ones were dropped (overflow).
    Push {
        entries: Vec<String>,
        dropped: u64,
    },
    /// An ingest batch took the `n` oldest pending entries.
    Taken {
        n: usize,
    },
    /// The batch in flight landed: its entries are retained, then the `evicted` oldest
    /// retained ones leave the window. `base` is set when the data opened a new user turn.
    Landed {
        evicted: u64,
        evicted_tokens: u64,
        shifted: bool,
        base: Option<Vec<u32>>,
    },
    /// The batch in flight failed: its entries are counted as dropped.
    Lost,
    /// A client turn ended (`turn`) or a conversation was set: the context is `base`, closed.
    Settle {
        base: Vec<u32>,
        turn: bool,
    },
    /// A warm set the context to `base` at `data_version`.
    Warmed {
        base: Vec<u32>,
        data_version: u64,
    },
    AddFlash {
        id: u64,
        query: String,
        max_tokens: usize,
    },
    DeleteFlash {
        id: u64,
    },
    /// A flash query's newest answer (not acknowledged to anyone: written within `LAZY_SYNC`).
    FlashAnswer {
        id: u64,
        answer: AnswerRecord,
    },
    /// Event ids up to here may be used before the next such record.
    Events {
        reserved: u64,
    },
    Delete,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub session: String,
    #[serde(flatten)]
    pub op: Op,
}

/// Every live session, by id.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Model {
    pub sessions: BTreeMap<String, DurableSession>,
}

impl Model {
    /// Apply one record. A record about a session the model does not hold (it was deleted,
    /// or its creation was never logged) is ignored: it cannot change what is kept.
    pub fn apply(&mut self, rec: Record) {
        let Record { session: id, op } = rec;
        match op {
            Op::Create { created_ms, params } => {
                let s = DurableSession::new(id.clone(), created_ms, params);
                self.sessions.insert(id, s);
                return;
            }
            Op::Import { state } => {
                let mut s = *state;
                s.id = id.clone();
                self.sessions.insert(id, s);
                return;
            }
            Op::Delete => {
                self.sessions.remove(&id);
                return;
            }
            _ => {}
        }
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        match op {
            Op::Create { .. } | Op::Import { .. } | Op::Delete => {}
            Op::Push { entries, dropped } => {
                s.total_pushed += entries.len() as u64;
                s.pending.extend(entries);
                for _ in 0..dropped {
                    s.pending.pop_front();
                }
                s.total_dropped += dropped;
            }
            Op::Taken { n } => {
                for _ in 0..n {
                    if let Some(e) = s.pending.pop_front() {
                        s.in_flight.push_back(e);
                    }
                }
            }
            Op::Landed {
                evicted,
                evicted_tokens,
                shifted,
                base,
            } => {
                let n = s.in_flight.len() as u64;
                s.entries.extend(s.in_flight.drain(..));
                for _ in 0..evicted {
                    s.entries.pop_front();
                }
                if let Some(b) = base {
                    s.base = Some(b);
                }
                s.chat_layout = false;
                s.data_version += 1;
                s.total_ingested += n;
                s.evicted += evicted;
                s.evicted_tokens += evicted_tokens;
                if shifted {
                    s.window_shifts += 1;
                } else if evicted > 0 {
                    s.window_recomputes += 1;
                }
            }
            Op::Lost => {
                s.total_dropped += s.in_flight.len() as u64;
                s.in_flight.clear();
            }
            Op::Settle { base, turn } => {
                s.base = Some(base);
                s.entries.clear();
                s.chat_layout = true;
                s.data_version += 1;
                if turn {
                    s.turns += 1;
                }
            }
            Op::Warmed { base, data_version } => {
                s.base = Some(base);
                s.entries.clear();
                s.chat_layout = true;
                s.data_version = data_version;
            }
            Op::AddFlash {
                id,
                query,
                max_tokens,
            } => {
                s.flash.push(FlashRecord {
                    id,
                    query,
                    max_tokens,
                    answer: None,
                });
                s.next_flash_id = s.next_flash_id.max(id + 1);
            }
            Op::DeleteFlash { id } => s.flash.retain(|q| q.id != id),
            Op::FlashAnswer { id, answer } => {
                if let Some(q) = s.flash.iter_mut().find(|q| q.id == id) {
                    q.answer = Some(answer);
                }
            }
            Op::Events { reserved } => s.next_event_id = s.next_event_id.max(reserved),
        }
    }
}
