//! The engine thread and its handle. One OS thread owns the `LlmEngine` (sequences, blocks,
//! scheduler) as plain data and runs `step()` in a loop; async callers hold an `EngineHandle`
//! and talk to it through commands. Each request gets its own event channel; dropping the
//! `RequestStream` (a client that went away) aborts the sequence and frees its KV at once.

use crate::constraint::TokenConstraint;
use crate::engine::LlmEngine;
use crate::pins::{PinKey, PinUse};
use crate::sampling::SamplingParams;
use crate::sequence::{FinishReason, Priority, SeqId, StopCriteria};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc as tokio_mpsc;

/// What a caller asks the engine to generate.
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub stop: StopCriteria,
    pub constraint: Option<Box<dyn TokenConstraint>>,
    pub priority: Priority,
    /// Start from (and maybe save to) a session's pinned KV.
    pub pin: Option<PinUse>,
}

impl GenerateRequest {
    /// A foreground request with no constraint and no pin.
    pub fn new(prompt: Vec<u32>, params: SamplingParams, stop: StopCriteria) -> Self {
        GenerateRequest {
            prompt,
            params,
            stop,
            constraint: None,
            priority: Priority::Foreground,
            pin: None,
        }
    }
}

/// One event of a request's life, in order: tokens, then exactly one `Finished`.
#[derive(Debug, Clone)]
pub enum RequestEvent {
    /// Sent once, when the sequence is first admitted: how much of the prompt the prefix
    /// cache already held.
    Admitted { num_cached_tokens: usize },
    Token {
        token: u32,
        logprob: f32,
        top_logprobs: Vec<(u32, f32)>,
    },
    Finished {
        reason: FinishReason,
        num_prompt_tokens: usize,
        num_cached_tokens: usize,
        num_output_tokens: usize,
        /// With `score_prompt_from`: the pick after each scored prompt row (token, top).
        prompt_scores: Vec<(u32, Vec<(u32, f32)>)>,
        /// Beside each scored row: the prompt's own next token's log-probability and rank.
        prompt_logprobs: Vec<(f32, u32)>,
        /// For a request that saves to a session pin: the KV tokens the pin holds after the
        /// save (the caller commits its mirror on this reply).
        pin_tokens: Option<usize>,
        /// Speculative decoding: draft tokens verified for this request, and accepted.
        num_draft_tokens: usize,
        num_accepted_draft_tokens: usize,
    },
    /// The engine could not run the request (an internal fault, reported not panicked).
    Failed(String),
}

enum Command {
    Submit {
        request_id: u64,
        request: Box<GenerateRequest>,
        events: tokio_mpsc::UnboundedSender<RequestEvent>,
    },
    Abort {
        request_id: u64,
    },
    /// Release a session's pinned KV.
    DropPin {
        key: PinKey,
    },
    /// Copy a pin's KV out (`LlmEngine::read_pin`).
    ReadPin {
        key: PinKey,
        reply: tokio::sync::oneshot::Sender<Option<crate::pins::PinKv>>,
    },
    /// Load KV into an empty pin (`LlmEngine::write_pin`); replies whether it did.
    WritePin {
        key: PinKey,
        kv: Box<crate::pins::PinKv>,
        cacheable: bool,
        reply: tokio::sync::oneshot::Sender<bool>,
    },
    /// Position-shift a pin (`LlmEngine::shift_pin`); replies whether it did.
    ShiftPin {
        key: PinKey,
        keep: usize,
        drop: usize,
        reply: tokio::sync::oneshot::Sender<bool>,
    },
}

/// Counters the engine publishes after every step; the HTTP side reads them without locks.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub steps: AtomicU64,
    pub preemptions: AtomicU64,
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub kv_blocks_free: AtomicUsize,
    pub kv_block_size: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefix_cached_tokens: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub decode_tokens: AtomicU64,
    /// Steps that computed at least one prompt token, and their total time.
    pub prefill_steps: AtomicU64,
    pub prefill_step_ns: AtomicU64,
    /// Steps that only decoded, and their total time.
    pub decode_steps: AtomicU64,
    pub decode_step_ns: AtomicU64,
    /// Requests submitted and not yet finished (queued or running).
    pub in_flight: AtomicUsize,
    pub step_ns_buckets: StepHistogram,
    /// Session pins and the pin tables dropped under memory pressure.
    pub pins: AtomicUsize,
    pub pin_evictions: AtomicU64,
    /// Speculative decoding since start: verifications, draft tokens verified, accepted.
    pub spec_drafts: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    /// The engine thread has exited (a caught panic, or every handle dropped).
    pub stopped: AtomicBool,
}

/// Marks the engine stopped when the thread leaves its loop, however it leaves.
struct StoppedOnExit(Arc<EngineStats>);

impl Drop for StoppedOnExit {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
    }
}

/// Step durations by kind, in fixed buckets (seconds), for the Prometheus histogram.
#[derive(Debug, Default)]
pub struct StepHistogram {
    pub prefill: [AtomicU64; STEP_BUCKETS.len() + 1],
    pub decode: [AtomicU64; STEP_BUCKETS.len() + 1],
}

pub const STEP_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

fn bucket_index(seconds: f64) -> usize {
    STEP_BUCKETS
        .iter()
        .position(|&b| seconds <= b)
        .unwrap_or(STEP_BUCKETS.len())
}

/// A cloneable handle to the engine thread. When the last handle drops, the thread finishes
/// what is in flight and exits.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    next_request_id: Arc<AtomicU64>,
    pub stats: Arc<EngineStats>,
    /// Each pin's resident KV tokens, as of the last step.
    pub pin_kv: Arc<Mutex<HashMap<PinKey, usize>>>,
}

/// A submitted request's events. Dropping it aborts the request if it has not finished.
pub struct RequestStream {
    request_id: u64,
    events: tokio_mpsc::UnboundedReceiver<RequestEvent>,
    commands: mpsc::Sender<Command>,
    finished: bool,
}

impl RequestStream {
    pub async fn next(&mut self) -> Option<RequestEvent> {
        let ev = self.events.recv().await;
        if matches!(
            ev,
            None | Some(RequestEvent::Finished { .. }) | Some(RequestEvent::Failed(_))
        ) {
            self.finished = true;
        }
        ev
    }

    pub fn request_id(&self) -> u64 {
        self.request_id
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort {
                request_id: self.request_id,
            });
        }
    }
}

/// The engine thread has exited (it panicked or was shut down).
#[derive(Debug, thiserror::Error)]
#[error("the engine is not running")]
pub struct EngineGone;

impl EngineHandle {
    /// Start the engine thread; `build` runs on it and makes the engine (so the model never
    /// has to cross threads).
    pub fn spawn<F>(build: F) -> std::io::Result<EngineHandle>
    where
        F: FnOnce() -> LlmEngine + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(EngineStats::default());
        let pin_kv = Arc::new(Mutex::new(HashMap::new()));
        let (thread_stats, thread_pins) = (stats.clone(), pin_kv.clone());
        std::thread::Builder::new()
            .name("vigil-engine".into())
            .spawn(move || {
                vigil_kernels::pool::lower_compute_priority();
                let _stopped = StoppedOnExit(thread_stats.clone());
                EngineLoop::new(build(), rx, thread_stats, thread_pins).run()
            })?;
        Ok(EngineHandle {
            commands: tx,
            next_request_id: Arc::new(AtomicU64::new(1)),
            stats,
            pin_kv,
        })
    }

    /// Whether the engine thread still runs (false after a caught panic).
    pub fn is_alive(&self) -> bool {
        !self.stats.stopped.load(Ordering::Acquire)
    }

    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineGone> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events_rx) = tokio_mpsc::unbounded_channel();
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent = self.commands.send(Command::Submit {
            request_id,
            request: Box::new(request),
            events: events_tx,
        });
        if sent.is_err() {
            self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineGone);
        }
        Ok(RequestStream {
            request_id,
            events: events_rx,
            commands: self.commands.clone(),
            finished: false,
        })
    }

    /// Release a session's pinned KV (a no-op for an unknown key).
    pub fn drop_pin(&self, key: PinKey) -> Result<(), EngineGone> {
        self.commands
            .send(Command::DropPin { key })
            .map_err(|_| EngineGone)
    }

    /// Cut tokens `keep .. keep + drop` out of a pin, moving the rest back with re-rotated
    /// keys (`LlmEngine::shift_pin`); whether it was done. Applied between steps, before any
    /// request submitted after it.
    pub async fn shift_pin(&self, key: PinKey, keep: usize, drop: usize) -> bool {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::ShiftPin {
            key,
            keep,
            drop,
            reply,
        };
        if self.commands.send(cmd).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// A copy of a pin's KV (None: no such pin, or its KV was evicted). Between steps.
    pub async fn read_pin(&self, key: PinKey) -> Option<crate::pins::PinKv> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::ReadPin { key, reply }).ok()?;
        rx.await.ok().flatten()
    }

    /// Load `kv` into pin `key` if it holds no KV yet; whether it did. Between steps.
    pub async fn write_pin(&self, key: PinKey, kv: crate::pins::PinKv, cacheable: bool) -> bool {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::WritePin {
            key,
            kv: Box::new(kv),
            cacheable,
            reply,
        };
        if self.commands.send(cmd).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Resident KV tokens of a pin, as of the last step (0 when unknown or evicted).
    pub fn pin_kv_tokens(&self, key: PinKey) -> usize {
        let map = self.pin_kv.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key).copied().unwrap_or(0)
    }
}

struct Live {
    seq_id: SeqId,
    events: tokio_mpsc::UnboundedSender<RequestEvent>,
    admitted: bool,
}

struct EngineLoop {
    engine: LlmEngine,
    commands: mpsc::Receiver<Command>,
    stats: Arc<EngineStats>,
    live: HashMap<u64, Live>,
    by_seq: HashMap<SeqId, u64>,
    disconnected: bool,
    pin_kv: Arc<Mutex<HashMap<PinKey, usize>>>,
    /// The pin generation last copied into `pin_kv`.
    published_pins: Option<u64>,
    /// Recent step time in ms (`track_step_time`).
    step_ms: f64,
    /// A step panicked: the engine's state cannot be trusted, so the loop ends.
    panicked: bool,
}

impl EngineLoop {
    fn new(
        engine: LlmEngine,
        commands: mpsc::Receiver<Command>,
        stats: Arc<EngineStats>,
        pin_kv: Arc<Mutex<HashMap<PinKey, usize>>>,
    ) -> Self {
        let mut me = EngineLoop {
            engine,
            commands,
            stats,
            live: HashMap::new(),
            by_seq: HashMap::new(),
            disconnected: false,
            pin_kv,
            published_pins: None,
            step_ms: 0.0,
            panicked: false,
        };
        me.publish();
        me
    }

    fn run(mut self) {
        loop {
            if self.live.is_empty() {
                if self.disconnected {
                    return;
                }
                match self.commands.recv() {
                    Ok(cmd) => self.apply(cmd),
                    Err(_) => return,
                }
            }
            loop {
                match self.commands.try_recv() {
                    Ok(cmd) => self.apply(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.disconnected = true;
                        break;
                    }
                }
            }
            if self.engine.has_work() {
                self.step();
            }
            if self.panicked {
                return;
            }
            self.publish();
        }
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                request_id,
                request,
                events,
            } => {
                let seq_id = self.engine.add_sequence(
                    request.prompt,
                    request.params,
                    request.stop,
                    request.priority,
                    request.pin,
                );
                if let Some(seq) = self.engine.seqs.get_mut(&seq_id) {
                    seq.constraint = request.constraint;
                }
                self.by_seq.insert(seq_id, request_id);
                self.live.insert(
                    request_id,
                    Live {
                        seq_id,
                        events,
                        admitted: false,
                    },
                );
            }
            Command::Abort { request_id } => self.abort(request_id),
            Command::DropPin { key } => {
                self.engine.pins.remove(key);
            }
            Command::ReadPin { key, reply } => {
                let _ = reply.send(self.engine.read_pin(key));
            }
            Command::WritePin {
                key,
                kv,
                cacheable,
                reply,
            } => {
                let _ = reply.send(self.engine.write_pin(key, *kv, cacheable));
            }
            Command::ShiftPin {
                key,
                keep,
                drop,
                reply,
            } => {
                let _ = reply.send(self.engine.shift_pin(key, keep, drop));
            }
        }
    }

    fn abort(&mut self, request_id: u64) {
        if let Some(live) = self.live.remove(&request_id) {
            self.engine.abort(live.seq_id);
            self.by_seq.remove(&live.seq_id);
            self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn step(&mut self) {
        let started = Instant::now();
        let engine = &mut self.engine;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step()));
        let elapsed = started.elapsed();
        let outputs = match result {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                // A scheduler bug: fail every request rather than panic the thread.
                self.fail_all(&e.to_string());
                return;
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                tracing::error!(
                    "engine step panicked: {what}; failing every request and stopping the engine"
                );
                self.panicked = true;
                let message = format!("internal error: the engine stopped ({what})");
                for live in std::mem::take(&mut self.live).into_values() {
                    let _ = live.events.send(RequestEvent::Failed(message.clone()));
                    self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
        };
        let st = self.stats.clone();
        st.steps.fetch_add(1, Ordering::Relaxed);
        let last = self.engine.last_step;
        st.prefill_tokens
            .fetch_add(last.num_prefill_tokens as u64, Ordering::Relaxed);
        st.decode_tokens
            .fetch_add(last.num_decode_tokens as u64, Ordering::Relaxed);
        let ns = elapsed.as_nanos() as u64;
        self.track_step_time(elapsed.as_secs_f64() * 1e3);
        let bucket = bucket_index(elapsed.as_secs_f64());
        if last.num_prefill_tokens > 0 {
            st.prefill_steps.fetch_add(1, Ordering::Relaxed);
            st.prefill_step_ns.fetch_add(ns, Ordering::Relaxed);
            st.step_ns_buckets.prefill[bucket].fetch_add(1, Ordering::Relaxed);
        } else if last.num_decode_tokens > 0 {
            st.decode_steps.fetch_add(1, Ordering::Relaxed);
            st.decode_step_ns.fetch_add(ns, Ordering::Relaxed);
            st.step_ns_buckets.decode[bucket].fetch_add(1, Ordering::Relaxed);
        }

        for out in outputs {
            let Some(&request_id) = self.by_seq.get(&out.seq_id) else {
                continue;
            };
            let Some(live) = self.live.get_mut(&request_id) else {
                continue;
            };
            let mut gone = false;
            if !live.admitted {
                live.admitted = true;
                let cached = self
                    .engine
                    .seqs
                    .get(&out.seq_id)
                    .map_or(0, |s| s.num_cached_tokens);
                gone |= live
                    .events
                    .send(RequestEvent::Admitted {
                        num_cached_tokens: cached,
                    })
                    .is_err();
            }
            st.generated_tokens.fetch_add(1, Ordering::Relaxed);
            gone |= live
                .events
                .send(RequestEvent::Token {
                    token: out.token,
                    logprob: out.logprob,
                    top_logprobs: out.top_logprobs,
                })
                .is_err();
            if let Some(reason) = out.finished {
                if let Some(seq) = self.engine.take_finished(out.seq_id) {
                    // A session's pin is saved as its sequence finishes: what the pin holds is
                    // published before the caller hears of the finish, so a caller that reads
                    // it next (a second warm) sees the save.
                    Self::publish_pins(&self.engine.pins, &self.pin_kv, &mut self.published_pins);
                    let pin_tokens = (seq.pin)
                        .filter(|p| p.save.is_some())
                        .map(|p| self.engine.pins.get(p.key).map_or(0, |k| k.num_kv_tokens()));
                    st.prompt_tokens
                        .fetch_add(seq.num_prompt_tokens as u64, Ordering::Relaxed);
                    st.prefix_cached_tokens
                        .fetch_add(seq.num_cached_tokens as u64, Ordering::Relaxed);
                    let _ = live.events.send(RequestEvent::Finished {
                        reason,
                        num_prompt_tokens: seq.num_prompt_tokens,
                        num_cached_tokens: seq.num_cached_tokens,
                        num_output_tokens: seq.num_output_tokens(),
                        prompt_scores: (seq.prompt_scores.into_iter())
                            .map(|s| (s.token, s.top_logprobs))
                            .collect(),
                        prompt_logprobs: seq.prompt_logprobs,
                        pin_tokens,
                        num_draft_tokens: seq.spec.proposed_total,
                        num_accepted_draft_tokens: seq.spec.accepted_total,
                    });
                }
                self.by_seq.remove(&out.seq_id);
                self.live.remove(&request_id);
                st.in_flight.fetch_sub(1, Ordering::Relaxed);
            } else if gone {
                // The caller dropped its receiver without an abort reaching us yet.
                self.abort(request_id);
            }
        }
    }

    /// Recent step time (an exponential average over about 8 steps), and the session deadline
    /// in steps it gives, where the deadline is set in milliseconds.
    fn track_step_time(&mut self, ms: f64) {
        self.step_ms = if self.step_ms > 0.0 {
            0.875 * self.step_ms + 0.125 * ms
        } else {
            ms
        };
        let config = &mut self.engine.scheduler.config;
        if config.session_deadline_ms > 0 {
            let steps = config.session_deadline_ms as f64 / self.step_ms.max(0.1);
            config.session_deadline_steps = (steps.floor() as u64).clamp(1, 64);
        }
    }

    fn fail_all(&mut self, message: &str) {
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(live) = self.live.get(&id) {
                let _ = live.events.send(RequestEvent::Failed(message.to_string()));
            }
            self.abort(id);
        }
    }

    fn publish(&mut self) {
        let st = &self.stats;
        let pool = self.engine.pool.borrow();
        st.kv_blocks_total
            .store(pool.num_blocks(), Ordering::Relaxed);
        st.kv_blocks_free
            .store(pool.num_free_blocks(), Ordering::Relaxed);
        st.kv_block_size.store(pool.block_size(), Ordering::Relaxed);
        st.waiting
            .store(self.engine.scheduler.waiting.len(), Ordering::Relaxed);
        st.running
            .store(self.engine.scheduler.running.len(), Ordering::Relaxed);
        st.preemptions
            .store(self.engine.scheduler.num_preemptions, Ordering::Relaxed);
        let pins = &self.engine.pins;
        st.pins.store(pins.len(), Ordering::Relaxed);
        st.pin_evictions
            .store(pins.num_evictions, Ordering::Relaxed);
        let spec = self.engine.spec_stats;
        st.spec_drafts.store(spec.drafts, Ordering::Relaxed);
        st.spec_draft_tokens
            .store(spec.proposed_tokens, Ordering::Relaxed);
        st.spec_accepted_tokens
            .store(spec.accepted_tokens, Ordering::Relaxed);
        Self::publish_pins(pins, &self.pin_kv, &mut self.published_pins);
    }

    /// Copy each pin's KV length into `pin_kv` if the pins changed since the last copy.
    fn publish_pins(
        pins: &crate::pins::PinStore,
        pin_kv: &Mutex<HashMap<PinKey, usize>>,
        published: &mut Option<u64>,
    ) {
        if *published != Some(pins.generation) {
            // Built outside the lock and swapped in: this thread runs at compute priority and
            // may be preempted anywhere, so it holds the lock readers wait on for a swap only.
            let fresh: HashMap<PinKey, usize> = pins.kv_tokens().collect();
            let stale = {
                let mut map = pin_kv.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::replace(&mut *map, fresh)
            };
            drop(stale);
            *published = Some(pins.generation);
        }
    }
}
