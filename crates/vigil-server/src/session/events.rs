//! A session's event bus: every event gets a monotonic id, is kept in a bounded replay buffer
//! (for `Last-Event-ID` resume) and is broadcast to the attached SSE and WebSocket streams.
//! A subscriber that falls more than the channel's capacity behind is told (`lagged`) and
//! cut off; it resynchronises by reconnecting.

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Events kept for resume.
pub const REPLAY_EVENTS: usize = 1024;
/// Events a subscriber may fall behind before it is cut off.
pub const CHANNEL_EVENTS: usize = 512;

#[derive(Debug)]
pub struct SessionEvent {
    pub id: u64,
    /// `data_updated`, `flash_ready`, `dropped`, `deleted`.
    pub kind: &'static str,
    pub data: Value,
}

pub struct EventBus {
    inner: Mutex<Replay>,
    tx: broadcast::Sender<Arc<SessionEvent>>,
}

struct Replay {
    next_id: u64,
    events: VecDeque<Arc<SessionEvent>>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    pub fn new() -> Self {
        Self::starting_at(1)
    }

    /// A bus whose first event gets id `next_id` (a restored session goes on from its ids).
    pub fn starting_at(next_id: u64) -> Self {
        EventBus {
            inner: Mutex::new(Replay {
                next_id: next_id.max(1),
                events: VecDeque::new(),
            }),
            tx: broadcast::channel(CHANNEL_EVENTS).0,
        }
    }

    pub fn publish(&self, kind: &'static str, data: Value) {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ev = Arc::new(SessionEvent {
            id: r.next_id,
            kind,
            data,
        });
        r.next_id += 1;
        if r.events.len() == REPLAY_EVENTS {
            r.events.pop_front();
        }
        r.events.push_back(ev.clone());
        // Sent under the lock, so ids reach every subscriber in order.
        let _ = self.tx.send(ev);
    }

    /// A live receiver, and the buffered events after `last_id` (all of them from the
    /// subscription on are on the receiver, none twice).
    pub fn subscribe(
        &self,
        last_id: Option<u64>,
    ) -> (
        broadcast::Receiver<Arc<SessionEvent>>,
        Vec<Arc<SessionEvent>>,
    ) {
        let r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.tx.subscribe();
        let replay = match last_id {
            Some(last) => r.events.iter().filter(|e| e.id > last).cloned().collect(),
            None => Vec::new(),
        };
        (rx, replay)
    }

    /// The id the next event will get.
    pub fn next_id(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).next_id
    }
}
