//! Stored responses (`store: true`, the default): what `GET /v1/responses/{id}` returns and
//! what `previous_response_id` continues. A task owns the entries; routes hold a
//! [`ResponseStore`] handle and send it commands.
//!
//! Each stored response keeps its Response object, its input items, and the conversation up to
//! and including its output (chat messages, without `instructions`, which OpenAI does not carry
//! over). A chain of responses continued by id shares one engine KV pin: each turn starts from a
//! fork of the pin cut to the longest common prefix with its prompt, so only the new input is
//! computed, and saves its prompt and output back. Entries live in memory for `ttl` after they
//! are created, at most `capacity` of them (the oldest go first); the pin is released when the
//! last entry of its chain goes. Under KV pressure the engine may drop an idle pin's blocks
//! first (it keeps the tokens; the next turn recomputes), like a session's.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use vigil_engine::engine_thread::EngineHandle;
use vigil_engine::pins::PinKey;

/// Pin keys of response chains have the top bit set; sessions count up from 1 below it.
const CHAIN_PIN_BASE: PinKey = 1 << 63;

/// One stored response.
#[derive(Debug)]
pub struct StoredResponse {
    /// The Response object as it was returned.
    pub response: Value,
    /// The request's input, as items (`GET /v1/responses/{id}/input_items`).
    pub input_items: Vec<Value>,
    /// Chat messages: the chain's earlier turns, this request's input and this output.
    pub conversation: Vec<Value>,
    /// The chain's KV pin.
    pub pin: PinKey,
}

enum Command {
    /// A request on the chain is in flight (its pin must outlive it).
    Hold(PinKey),
    Release(PinKey),
    Put(String, Arc<StoredResponse>),
    Get(String, oneshot::Sender<Option<Arc<StoredResponse>>>),
    Delete(String, oneshot::Sender<bool>),
}

/// The handle routes hold; the store's task ends when the last handle drops.
pub struct ResponseStore {
    tx: mpsc::UnboundedSender<Command>,
    next_pin: AtomicU64,
    ttl: Duration,
}

impl ResponseStore {
    /// Start the store's task. `ttl` zero stores nothing (`store: true` is then refused).
    pub fn new(engine: EngineHandle, ttl: Duration, capacity: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = StoreTask {
            entries: HashMap::new(),
            order: VecDeque::new(),
            chains: HashMap::new(),
            engine,
            ttl,
            capacity: capacity.max(1),
        };
        tokio::spawn(task.run(rx));
        ResponseStore {
            tx,
            next_pin: AtomicU64::new(0),
            ttl,
        }
    }

    /// Whether responses are kept at all (`--response-ttl` above zero).
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A pin key for a new chain.
    pub fn new_chain_pin(&self) -> PinKey {
        CHAIN_PIN_BASE | self.next_pin.fetch_add(1, Ordering::Relaxed)
    }

    /// Keep the chain's pin while a request runs on it: the pin is released only when no
    /// entry and no request holds it.
    pub fn hold(&self, pin: PinKey) -> ChainHold {
        let _ = self.tx.send(Command::Hold(pin));
        ChainHold {
            tx: self.tx.clone(),
            pin,
        }
    }

    pub fn put(&self, id: String, entry: StoredResponse) {
        let _ = self.tx.send(Command::Put(id, Arc::new(entry)));
    }

    pub async fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Get(id.to_string(), reply)).ok()?;
        rx.await.ok().flatten()
    }

    pub async fn delete(&self, id: &str) -> bool {
        let (reply, rx) = oneshot::channel();
        if self
            .tx
            .send(Command::Delete(id.to_string(), reply))
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// A request's hold on its chain's pin, released on drop.
pub struct ChainHold {
    tx: mpsc::UnboundedSender<Command>,
    pin: PinKey,
}

impl Drop for ChainHold {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Release(self.pin));
    }
}

struct StoreTask {
    entries: HashMap<String, (Instant, Arc<StoredResponse>)>,
    /// Ids by creation, oldest first (deleted ids are skipped when reached).
    order: VecDeque<String>,
    /// Entries and requests in flight holding each chain pin.
    chains: HashMap<PinKey, usize>,
    engine: EngineHandle,
    ttl: Duration,
    capacity: usize,
}

impl StoreTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                },
                _ = tick.tick() => self.expire(),
            }
        }
        // The server is going away: its pins go with the engine.
    }

    fn handle(&mut self, cmd: Command) {
        self.expire();
        match cmd {
            Command::Hold(pin) => *self.chains.entry(pin).or_default() += 1,
            Command::Release(pin) => self.release(pin),
            Command::Put(id, entry) => {
                *self.chains.entry(entry.pin).or_default() += 1;
                self.order.push_back(id.clone());
                if let Some((_, old)) = self.entries.insert(id, (Instant::now(), entry)) {
                    self.release(old.pin);
                }
                while self.entries.len() > self.capacity {
                    let Some(oldest) = self.order.pop_front() else {
                        break;
                    };
                    self.remove(&oldest);
                }
            }
            Command::Get(id, reply) => {
                let _ = reply.send(self.entries.get(&id).map(|(_, e)| e.clone()));
            }
            Command::Delete(id, reply) => {
                let _ = reply.send(self.remove(&id));
            }
        }
    }

    fn expire(&mut self) {
        let now = Instant::now();
        while let Some(id) = self.order.front() {
            match self.entries.get(id) {
                Some((at, _)) if now.duration_since(*at) < self.ttl => break,
                _ => {
                    if let Some(id) = self.order.pop_front() {
                        self.remove(&id);
                    }
                }
            }
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        match self.entries.remove(id) {
            Some((_, e)) => {
                self.release(e.pin);
                true
            }
            None => false,
        }
    }

    fn release(&mut self, pin: PinKey) {
        let Some(n) = self.chains.get_mut(&pin) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.chains.remove(&pin);
            let _ = self.engine.drop_pin(pin);
        }
    }
}
