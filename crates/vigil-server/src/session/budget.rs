//! The server-wide budget of queued session data (`--max-pending-bytes-total`): one atomic
//! counter every session's actor reserves from on a push and releases into when entries are
//! taken for ingest or dropped, and what one queued entry costs against it.

use std::sync::atomic::Ordering;

/// Bookkeeping a queued entry costs beyond its text (its token vector and queue slot).
const ENTRY_OVERHEAD: usize = 64;

/// What one queued entry counts against `--max-pending-bytes-total`.
pub fn queued_cost(e: &super::state::Entry) -> usize {
    e.text.len() + 4 * e.tokens.len() + ENTRY_OVERHEAD
}

/// Bytes of queued session data across every session, and the most the server holds
/// (`--max-pending-bytes-total`). Shared by every session's actor: one atomic counter.
#[derive(Debug)]
pub struct QueueBudget {
    used: std::sync::atomic::AtomicUsize,
    pub max: usize,
}

impl QueueBudget {
    pub fn new(max: usize) -> Self {
        QueueBudget {
            used: std::sync::atomic::AtomicUsize::new(0),
            max,
        }
    }

    /// Take `bytes`, or say how many are held.
    pub fn reserve(&self, bytes: usize) -> Result<(), usize> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + bytes <= self.max).then_some(q + bytes)
            })
            .map(|_| ())
    }

    /// Take `bytes` whatever is held (entries restored from the journal were acknowledged).
    pub fn force(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn release(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(bytes))
            });
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}
