//! The server's own counters (requests by outcome, latency histograms) and the Prometheus text
//! exposition of them together with the engine's published `EngineStats`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use vigil_engine::engine_thread::{EngineStats, STEP_BUCKETS};

const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        self.render_labelled(out, name, help, "");
    }

    /// With `label` (`key="value",`) on every series line.
    pub(crate) fn render_labelled(&self, out: &mut String, name: &str, help: &str, label: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        write_buckets(out, name, label, &LATENCY_BUCKETS, &self.buckets, sum);
    }
}

/// One histogram series: cumulative `_bucket` lines for `bounds` (then `+Inf`, the last count),
/// `_sum` and `_count`. `label` is `key="value",` or empty.
fn write_buckets(
    out: &mut String,
    name: &str,
    label: &str,
    bounds: &[f64],
    counts: &[AtomicU64],
    sum: f64,
) {
    let mut cum = 0;
    for (i, count) in counts.iter().enumerate() {
        cum += count.load(Ordering::Relaxed);
        match bounds.get(i) {
            Some(b) => writeln!(out, "{name}_bucket{{{label}le=\"{b}\"}} {cum}"),
            None => writeln!(out, "{name}_bucket{{{label}le=\"+Inf\"}} {cum}"),
        }
        .ok();
    }
    let label = label.trim_end_matches(',');
    let braces = if label.is_empty() {
        String::new()
    } else {
        format!("{{{label}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {sum}\n{name}_count{braces} {cum}");
}

/// How a request ended, for `vigil_requests_total{status=...}` and `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    ClientError,
    ServerError,
    Cancelled,
}

#[derive(Debug, Default)]
pub struct ServerMetrics {
    pub flash_hits: AtomicU64,
    pub flash_misses: AtomicU64,
    pub flash_evaluations: AtomicU64,
    pub flash_skipped: AtomicU64,
    /// Flash evaluations that could not run (the query was parked until newer data).
    pub flash_errors: AtomicU64,
    /// Flash evaluations that verified the previous answer as a draft (every row scored).
    pub flash_drafts: AtomicU64,
    /// Flash evaluations settled by verifying the previous answer in one pass.
    pub flash_verified: AtomicU64,
    /// Draft tokens (from previous answers) the model confirmed.
    pub flash_draft_tokens: AtomicU64,
    /// Tokenizer/template jobs run on the bounded pool.
    pub cpu_jobs_run: AtomicU64,
    /// Jobs never run because their client left while they waited for the pool.
    pub cpu_jobs_abandoned: AtomicU64,
    pub session_pushed_entries: AtomicU64,
    pub session_ingested_entries: AtomicU64,
    pub session_dropped_entries: AtomicU64,
    pub session_ingested_tokens: AtomicU64,
    /// Versions behind the session, summed over served flash answers.
    pub flash_lag_versions: AtomicU64,
    pub sessions_live: AtomicUsize,
    /// Background requests (flash evaluations, ingest, warm) submitted and not yet finished.
    pub background_in_flight: AtomicUsize,
    /// Client requests admitted and not yet ended (the `--max-seqs` + `--max-queue` bound).
    pub foreground_in_flight: AtomicUsize,
    pub requests_started: AtomicU64,
    pub requests_ok: AtomicU64,
    pub requests_client_error: AtomicU64,
    pub requests_server_error: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_rejected_overload: AtomicU64,
    /// Open client connections (the accept loop keeps it).
    pub connections: std::sync::Arc<AtomicU64>,
    pub tool_calls_malformed: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
}

impl ServerMetrics {
    pub fn record(&self, outcome: Outcome) {
        let c = match outcome {
            Outcome::Ok => &self.requests_ok,
            Outcome::ClientError => &self.requests_client_error,
            Outcome::ServerError => &self.requests_server_error,
            Outcome::Cancelled => &self.requests_cancelled,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, engine: &EngineStats) -> String {
        let mut out = String::with_capacity(8192);
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP vigil_requests_total Requests by how they ended.\n# TYPE vigil_requests_total counter"
        );
        for (status, v) in [
            ("ok", l(&self.requests_ok)),
            ("client_error", l(&self.requests_client_error)),
            ("server_error", l(&self.requests_server_error)),
            ("cancelled", l(&self.requests_cancelled)),
            ("overloaded", l(&self.requests_rejected_overload)),
        ] {
            let _ = writeln!(out, "vigil_requests_total{{status=\"{status}\"}} {v}");
        }
        let counters: [(&str, &str, u64); 28] = [
            (
                "vigil_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                l(&engine.prompt_tokens),
            ),
            (
                "vigil_generated_tokens_total",
                "Tokens generated.",
                l(&engine.generated_tokens),
            ),
            (
                "vigil_prefix_cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
                l(&engine.prefix_cached_tokens),
            ),
            (
                "vigil_prefill_tokens_total",
                "Prompt tokens computed (including recompute after preemption).",
                l(&engine.prefill_tokens),
            ),
            (
                "vigil_decode_tokens_total",
                "Decode tokens computed.",
                l(&engine.decode_tokens),
            ),
            (
                "vigil_preemptions_total",
                "Sequences preempted by recompute.",
                l(&engine.preemptions),
            ),
            ("vigil_steps_total", "Engine steps run.", l(&engine.steps)),
            (
                "vigil_tool_calls_malformed_total",
                "Tool calls whose arguments were not valid JSON.",
                l(&self.tool_calls_malformed),
            ),
            (
                "vigil_requests_started_total",
                "Requests accepted.",
                l(&self.requests_started),
            ),
            (
                "vigil_flash_hits_total",
                "Session generates answered from a flash query's cached answer.",
                l(&self.flash_hits),
            ),
            (
                "vigil_flash_misses_total",
                "Session generates naming a flash query that had to generate.",
                l(&self.flash_misses),
            ),
            (
                "vigil_flash_evaluations_total",
                "Flash query evaluations completed.",
                l(&self.flash_evaluations),
            ),
            (
                "vigil_flash_skipped_total",
                "Data versions a flash query skipped because a newer one arrived first.",
                l(&self.flash_skipped),
            ),
            (
                "vigil_flash_errors_total",
                "Flash evaluations that could not run; the query waits for newer data.",
                l(&self.flash_errors),
            ),
            (
                "vigil_flash_drafts_total",
                "Flash evaluations that verified the previous answer as a draft.",
                l(&self.flash_drafts),
            ),
            (
                "vigil_flash_verified_total",
                "Flash evaluations settled by verifying the previous answer in one pass.",
                l(&self.flash_verified),
            ),
            (
                "vigil_flash_draft_tokens_total",
                "Tokens of previous flash answers the model confirmed as drafts.",
                l(&self.flash_draft_tokens),
            ),
            (
                "vigil_cpu_jobs_run_total",
                "Tokenizer and template jobs run on the bounded pool.",
                l(&self.cpu_jobs_run),
            ),
            (
                "vigil_cpu_jobs_abandoned_total",
                "Tokenizer and template jobs dropped unrun: their client left while they waited.",
                l(&self.cpu_jobs_abandoned),
            ),
            (
                "vigil_flash_lag_versions_total",
                "Versions behind the session, summed over served flash answers.",
                l(&self.flash_lag_versions),
            ),
            (
                "vigil_session_pushed_entries_total",
                "Entries accepted by session pushes.",
                l(&self.session_pushed_entries),
            ),
            (
                "vigil_session_ingested_entries_total",
                "Session entries made KV-resident.",
                l(&self.session_ingested_entries),
            ),
            (
                "vigil_session_dropped_entries_total",
                "Session entries dropped (queue overflow, or a batch that could not run).",
                l(&self.session_dropped_entries),
            ),
            (
                "vigil_kv_pin_evictions_total",
                "Idle sessions' KV released under memory pressure.",
                l(&engine.pin_evictions),
            ),
            (
                "vigil_spec_verifications_total",
                "Speculative decoding: steps in which a sequence verified a draft.",
                l(&engine.spec_drafts),
            ),
            (
                "vigil_spec_proposed_tokens_total",
                "Speculative decoding: draft tokens verified.",
                l(&engine.spec_draft_tokens),
            ),
            (
                "vigil_spec_accepted_tokens_total",
                "Speculative decoding: draft tokens the model confirmed.",
                l(&engine.spec_accepted_tokens),
            ),
            (
                "vigil_spec_rejected_tokens_total",
                "Speculative decoding: draft tokens dropped (their KV rolled back).",
                l(&engine.spec_draft_tokens).saturating_sub(l(&engine.spec_accepted_tokens)),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let queried = l(&engine.prompt_tokens);
        let hit_rate = if queried == 0 {
            0.0
        } else {
            l(&engine.prefix_cached_tokens) as f64 / queried as f64
        };
        let prefill_steps = l(&engine.prefill_steps);
        let mean_prefill = if prefill_steps == 0 {
            0.0
        } else {
            l(&engine.prefill_tokens) as f64 / prefill_steps as f64
        };
        let u = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as f64;
        let (proposed, accepted) = (
            l(&engine.spec_draft_tokens),
            l(&engine.spec_accepted_tokens),
        );
        let acceptance = if proposed == 0 {
            0.0
        } else {
            accepted as f64 / proposed as f64
        };
        let verifications = l(&engine.spec_drafts);
        // vLLM's mean acceptance length: tokens a verifying step yields (accepted + 1).
        let mean_accepted = if verifications == 0 {
            0.0
        } else {
            1.0 + accepted as f64 / verifications as f64
        };
        let gauges: [(&str, &str, f64); 10] = [
            (
                "vigil_sessions_live",
                "Live sessions.",
                u(&self.sessions_live),
            ),
            (
                "vigil_queue_depth",
                "Requests waiting to be admitted.",
                u(&engine.waiting),
            ),
            (
                "vigil_running_sequences",
                "Sequences being computed.",
                u(&engine.running),
            ),
            (
                "vigil_kv_blocks_total",
                "KV cache blocks in the pool.",
                u(&engine.kv_blocks_total),
            ),
            (
                "vigil_kv_blocks_free",
                "KV cache blocks free (including cached, evictable ones).",
                u(&engine.kv_blocks_free),
            ),
            (
                "vigil_kv_blocks_used",
                "KV cache blocks held by sequences.",
                u(&engine.kv_blocks_total) - u(&engine.kv_blocks_free),
            ),
            (
                "vigil_prefix_cache_hit_rate",
                "Share of finished requests' prompt tokens served from the prefix cache.",
                hit_rate,
            ),
            (
                "vigil_prefill_tokens_per_step",
                "Mean prompt tokens computed per step that computed any.",
                mean_prefill,
            ),
            (
                "vigil_spec_acceptance_rate",
                "Speculative decoding: share of draft tokens accepted since start.",
                acceptance,
            ),
            (
                "vigil_spec_mean_accepted_length",
                "Speculative decoding: tokens per verifying step (accepted drafts + 1).",
                mean_accepted,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.ttft.render(
            &mut out,
            "vigil_time_to_first_token_seconds",
            "Time from request arrival to its first token.",
        );
        self.inter_token.render(
            &mut out,
            "vigil_inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        self.e2e.render(
            &mut out,
            "vigil_request_duration_seconds",
            "Time from request arrival to its end.",
        );
        let name = "vigil_step_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Engine step time by kind (steps with any prompt token count as prefill).\n# TYPE {name} histogram");
        for (kind, buckets, sum_ns) in [
            (
                "prefill",
                &engine.step_ns_buckets.prefill,
                l(&engine.prefill_step_ns),
            ),
            (
                "decode",
                &engine.step_ns_buckets.decode,
                l(&engine.decode_step_ns),
            ),
        ] {
            let label = format!("kind=\"{kind}\",");
            write_buckets(
                &mut out,
                name,
                &label,
                &STEP_BUCKETS,
                buckets,
                sum_ns as f64 / 1e9,
            );
        }
        out
    }
}
