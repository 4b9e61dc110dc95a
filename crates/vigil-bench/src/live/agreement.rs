//! With `--window-mode shift`: how often the approximate position-shift window answers the
//! flash query as exact mode does. After the timed phases, the stream's entries are pushed
//! again, one at a time, into two fresh sessions on the target, one per mode, with the same
//! window, prompt and flash query; after each entry both answers are read once current, and
//! compared from the first eviction on (before it the two modes hold the same KV).

use super::session::Session;
use super::{FLASH_QUESTION, SYSTEM_PROMPT};
use crate::client::Client;
use crate::BenchError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Disagreements kept in the record.
const EXAMPLES: usize = 3;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Agreement {
    /// Entries after which both answers were compared, and those where they were equal.
    pub compared: u32,
    pub agreed: u32,
    /// Evictions the shift session did by shifting (its `window_shifts` at the end).
    pub shifts: u64,
    /// A few disagreements: `[entries pushed, exact answer, shift answer]`.
    pub examples: Vec<[String; 3]>,
}

pub struct Twin<'a> {
    pub client: &'a Client,
    pub window: u32,
    pub evict_to: u32,
    pub answer_tokens: u32,
    pub timeout: Duration,
}

impl Twin<'_> {
    pub async fn run(&self, entries: &[String]) -> Result<Agreement, BenchError> {
        let (w, e) = (self.window, self.evict_to);
        let make = |mode| Session::create_with(self.client, w, e, SYSTEM_PROMPT, Some(mode));
        let (Some(exact), Some(shift)) = (make("exact").await?, make("shift").await?) else {
            return Err(BenchError::Setting(
                "the target lost its session API".into(),
            ));
        };
        let mut out = Agreement::default();
        let r = self.compare(&exact, &shift, entries, &mut out).await;
        out.shifts = (shift.get().await.ok())
            .and_then(|v| v.get("window_shifts").and_then(Value::as_u64))
            .unwrap_or(0);
        let _ = exact.delete().await;
        let _ = shift.delete().await;
        r.map(|()| out)
    }

    async fn compare(
        &self,
        exact: &Session,
        shift: &Session,
        entries: &[String],
        out: &mut Agreement,
    ) -> Result<(), BenchError> {
        let fe = exact.add_flash(FLASH_QUESTION, self.answer_tokens).await?;
        let fs = shift.add_flash(FLASH_QUESTION, self.answer_tokens).await?;
        for (i, entry) in entries.iter().enumerate() {
            let one = std::slice::from_ref(entry);
            exact.push(one).await?;
            shift.push(one).await?;
            exact.wait_ingested(entry, self.timeout).await?;
            shift.wait_ingested(entry, self.timeout).await?;
            let a = self.fresh(exact, fe).await?;
            let b = self.fresh(shift, fs).await?;
            let evicted = (exact.get().await?)
                .get("evicted")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            if evicted == 0 {
                continue;
            }
            out.compared += 1;
            if a == b {
                out.agreed += 1;
            } else if out.examples.len() < EXAMPLES {
                out.examples.push([(i + 1).to_string(), a, b]);
            }
        }
        Ok(())
    }

    /// The flash answer once it is current at the session's version.
    async fn fresh(&self, s: &Session, fid: u64) -> Result<String, BenchError> {
        let t0 = Instant::now();
        loop {
            let q = s.flash(fid).await?;
            if q.get("fresh").and_then(Value::as_bool) == Some(true) {
                let v = q.get("value").and_then(Value::as_str).unwrap_or_default();
                return Ok(v.to_string());
            }
            if t0.elapsed() > self.timeout {
                return Err(BenchError::Reply {
                    url: format!("{}{}", s.path("/flash"), ""),
                    what: "the flash answer never became current".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
