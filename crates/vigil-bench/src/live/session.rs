//! The session calls the live stream makes (LayerScale Gen 2 with Vigil's extensions, see
//! docs/sessions.md): create, push, wait until pushed data is KV-resident, flash queries, the
//! retained entries, delete.

use crate::client::Client;
use crate::BenchError;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);

/// A session on one target.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    client: Client,
}

impl Session {
    /// Creates a session with a window (evicting to `evict_to`) and a pinned system prompt; `None` when the target has
    /// no session API (404 or 405 on `POST /v1/sessions`).
    pub async fn create(
        client: &Client,
        window: u32,
        evict_to: u32,
        prompt: &str,
    ) -> Result<Option<Session>, BenchError> {
        Self::create_with(client, window, evict_to, prompt, None).await
    }

    /// `create`, naming the window mode (Vigil: `exact` or `shift`) when given.
    pub async fn create_with(
        client: &Client,
        window: u32,
        evict_to: u32,
        prompt: &str,
        window_mode: Option<&str>,
    ) -> Result<Option<Session>, BenchError> {
        let mut body = json!({"window": window, "evict_to": evict_to, "prompt": prompt});
        if let Some(m) = window_mode {
            body["window_mode"] = json!(m);
        }
        match client.post_json("/v1/sessions", &body).await {
            Ok(v) => {
                let id = v
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| BenchError::Reply {
                        url: format!("{}/v1/sessions", client.base()),
                        what: "no session `id`".into(),
                    })?;
                Ok(Some(Session {
                    id: id.to_string(),
                    client: client.clone(),
                }))
            }
            Err(BenchError::Status {
                status: 404 | 405, ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn path(&self, rest: &str) -> String {
        format!("/v1/sessions/{}{rest}", self.id)
    }

    pub async fn get(&self) -> Result<Value, BenchError> {
        Ok(self.client.get_json(&self.path("")).await?.0)
    }

    /// Entries made KV-resident so far: the session's `total_ingested`, or on a server that
    /// does not report it, the retained plus evicted entries of `GET …/data`.
    pub async fn ingested(&self) -> Result<Option<u64>, BenchError> {
        let v = self.get().await?;
        if let Some(n) = v.get("total_ingested").and_then(Value::as_u64) {
            return Ok(Some(n));
        }
        let d = self.client.get_json(&self.path("/data")).await?.0;
        let entries = d.get("entries").and_then(Value::as_array).map(Vec::len);
        let evicted = d.get("evicted").and_then(Value::as_u64);
        Ok(entries.zip(evicted).map(|(n, e)| n as u64 + e))
    }

    pub async fn push(&self, entries: &[String]) -> Result<Value, BenchError> {
        self.client
            .post_json(&self.path("/push"), &json!({"data": entries}))
            .await
    }

    /// Waits until the session's data ends with `last` and nothing is pending: the batch that
    /// held it is ingested and KV-resident. (The SDK's test, a `data_version` above the push
    /// ack's, can pass early when the version moved for the opening prompt's own ingest.)
    /// Returns the retained entries.
    pub async fn wait_ingested(
        &self,
        last: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BenchError> {
        let t0 = Instant::now();
        loop {
            let v = self.client.get_json(&self.path("/data")).await?.0;
            let entries: Vec<String> = (v
                .get("entries")
                .and_then(Value::as_array)
                .into_iter()
                .flatten())
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
            let pending = v.get("pending").and_then(Value::as_u64).unwrap_or(0);
            if pending == 0 && entries.last().map(String::as_str) == Some(last) {
                return Ok(entries);
            }
            if t0.elapsed() > timeout {
                return Err(BenchError::NotReady {
                    url: format!("{}{}", self.client.base(), self.path("/data")),
                    waited_s: t0.elapsed().as_secs(),
                    last: format!(
                        "pushed data not ingested: {} entries, {pending} pending",
                        entries.len()
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Registers a flash query; returns its id.
    pub async fn add_flash(&self, query: &str, max_tokens: u32) -> Result<u64, BenchError> {
        let v = (self.client)
            .post_json(
                &self.path("/flash"),
                &json!({"query": query, "max_tokens": max_tokens}),
            )
            .await?;
        v.get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| BenchError::Reply {
                url: format!("{}{}", self.client.base(), self.path("/flash")),
                what: format!("no flash query `id` in {v}"),
            })
    }

    /// The flash query object `fid` as listed now.
    pub async fn flash(&self, fid: u64) -> Result<Value, BenchError> {
        let v = self.client.get_json(&self.path("/flash")).await?.0;
        (v.get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten())
        .find(|q| q.get("id").and_then(Value::as_u64) == Some(fid))
        .cloned()
        .ok_or_else(|| BenchError::Reply {
            url: format!("{}{}", self.client.base(), self.path("/flash")),
            what: format!("flash query {fid} is not listed"),
        })
    }

    /// Waits for the flash query's first answer; the query object, or `None` after `timeout`.
    pub async fn wait_flash_answer(
        &self,
        fid: u64,
        timeout: Duration,
    ) -> Result<Option<Value>, BenchError> {
        let t0 = Instant::now();
        loop {
            let q = self.flash(fid).await?;
            if q.get("value").is_some() {
                return Ok(Some(q));
            }
            if t0.elapsed() > timeout {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub async fn delete_flash(&self, fid: u64) -> Result<(), BenchError> {
        self.client
            .delete_json(&self.path(&format!("/flash/{fid}")))
            .await
            .map(drop)
    }

    pub async fn delete(&self) -> Result<(), BenchError> {
        self.client.delete_json(&self.path("")).await.map(drop)
    }
}
