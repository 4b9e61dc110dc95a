//! The actor's side of KV offload (`journal/kv_disk.rs`): once a session's KV has not changed
//! for `OFFLOAD_IDLE` and no work is queued on it, its pin is copied out of the engine and
//! written to disk; a restored session reads that file back into its pin before its rebuild
//! (which then computes only what the file lacks). Both run in tasks that report back on the
//! job channel, like the rest of the session's engine work.

use super::actor::{JobResult, SessionActor, Writer};
use super::state::{Layout, WindowMode};
use std::hash::{Hash, Hasher};
use std::time::Duration;
use tokio::time::Instant;

/// How long a session's KV stays unchanged before it is written to disk.
pub const OFFLOAD_IDLE: Duration = Duration::from_secs(2);

/// How an offload ended: the hash of the tokens now on disk, or why it failed.
pub type Offloaded = Result<Option<u64>, String>;

/// How a restore from disk ended: the tokens loaded into the pin and the time it took.
pub struct Restored {
    pub tokens: usize,
    pub ms: u128,
}

fn tokens_hash(tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

impl SessionActor {
    /// The pin's content changed: offload it once it has been quiet for a while.
    pub(super) fn kv_changed(&mut self) {
        if self.deps.kv_disk.is_some() {
            self.kv_dirty = Some(Instant::now());
        }
    }

    /// When an offload falls due (the loop wakes then).
    pub(super) fn offload_at(&self) -> Option<Instant> {
        self.kv_dirty.map(|t| t + OFFLOAD_IDLE)
    }

    /// Start an offload if one is due and the session is quiet.
    pub(super) fn maybe_offload(&mut self) {
        let (Some(disk), Some(at)) = (self.deps.kv_disk.clone(), self.offload_at()) else {
            return;
        };
        let quiet = matches!(self.writer, Writer::Idle)
            && self.st.pending.is_empty()
            && !self.flash_running
            && !self.rebuilding
            && !self.offloading;
        if !quiet || Instant::now() < at {
            return;
        }
        self.kv_dirty = None;
        self.offloading = true;
        let (engine, pin, jobs) = (
            self.deps.engine.clone(),
            self.head.pin,
            self.jobs_tx.clone(),
        );
        let (id, last) = (self.head.id.clone(), self.offloaded_hash);
        tokio::spawn(async move {
            let result = match engine.read_pin(pin).await {
                None => Ok(None),
                Some(kv) if Some(tokens_hash(&kv.tokens)) == last => Ok(last),
                Some(kv) => {
                    let h = tokens_hash(&kv.tokens);
                    let write = move || disk.write(&id, &kv).map(|_| Some(h));
                    match tokio::task::spawn_blocking(write).await {
                        Ok(r) => r.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
            };
            let _ = jobs.send(JobResult::Offloaded(result));
        });
    }

    pub(super) fn offload_done(&mut self, r: Offloaded) {
        self.offloading = false;
        match r {
            Ok(h) => self.offloaded_hash = h.or(self.offloaded_hash),
            Err(e) => tracing::warn!(session = %self.head.id, "KV offload failed: {e}"),
        }
    }

    /// Read the session's KV file (if any) into its pin before the rebuild runs; the writer is
    /// held meanwhile. Only the part that is a prefix of the context to rebuild is loaded.
    pub(super) fn start_restore(&mut self) {
        let Some(disk) = self.deps.kv_disk.clone() else {
            return;
        };
        self.writer = Writer::Restore;
        let target = match self.st.layout {
            Layout::Data => self.st.mirror(),
            Layout::Chat => self.st.base.clone(),
        };
        // Shifted windows hold KV no prefill computes: it must not serve other requests.
        let cacheable = self.settings.params.window_mode != WindowMode::Shift;
        let (engine, pin, jobs, id) = (
            self.deps.engine.clone(),
            self.head.pin,
            self.jobs_tx.clone(),
            self.head.id.clone(),
        );
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let read = tokio::task::spawn_blocking(move || disk.read(&id)).await;
            let mut tokens = 0;
            if let Ok(Some(mut kv)) = read {
                let common = (kv.tokens.iter().zip(&target))
                    .take_while(|(a, b)| a == b)
                    .count();
                kv.truncate(common);
                if common > 0 && engine.write_pin(pin, kv, cacheable).await {
                    tokens = common;
                }
            }
            let r = Restored {
                tokens,
                ms: t.elapsed().as_millis(),
            };
            let _ = jobs.send(JobResult::Restored(r));
        });
    }

    pub(super) fn restore_done(&mut self, r: Restored) {
        self.writer = Writer::Idle;
        if r.tokens > 0 {
            tracing::info!(session = %self.head.id, "KV of {} tokens read back from disk in {} ms", r.tokens, r.ms);
        }
    }
}
