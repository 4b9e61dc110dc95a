//! `vigil serve`: the OpenAI- and Anthropic-compatible server over one engine.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use vigil_engine::speculative::{SpecConfig, SpecMethod};
use vigil_model::load::LoadOptions;
use vigil_server::{EngineOptions, ServerConfig};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A `.gguf` file or an HF model directory. Default: SmolLM2-135M-Instruct Q4_1, pulled on
    /// first use.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on (`0.0.0.0` for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model id reported by `/v1/models` (default: the file name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Kernel worker threads (default: all cores).
    #[arg(long, value_parser = crate::at_least_one)]
    threads: Option<usize>,
    /// Cap on the context length (default: the model's own).
    #[arg(long)]
    ctx: Option<usize>,
    /// KV cache memory, e.g. `2GiB`, `512MiB` (default: 10% of RAM, at most 2 GiB).
    #[arg(long)]
    kv_memory: Option<String>,
    /// Tokens computed per engine step across all sequences (prefill chunks + decodes).
    #[arg(long, default_value_t = 512)]
    max_batched_tokens: usize,
    /// Tokens of each step that session work (ingest, flash evaluations, warm) may take while
    /// client requests run in it: more keeps ingest ahead, fewer keeps client tokens quicker.
    #[arg(long, default_value_t = 64)]
    session_step_tokens: usize,
    /// Most tokens ingest or warm work computes in one step, whatever else runs: a flash
    /// evaluation or a request arriving mid-recompute waits at most one such chunk.
    #[arg(long, default_value_t = 128)]
    session_chunk_tokens: usize,
    /// Milliseconds within which session work (an ingest batch, a flash evaluation) should
    /// finish beside client requests: its share of each step grows to what that takes, up to
    /// half a step, and past the deadline to all but each client's next token. 0: 4 steps.
    #[arg(long, default_value_t = 500)]
    session_deadline_ms: u64,
    /// Tokens of a whole engine step while session work (ingest, a flash evaluation) is
    /// queued or running, if fewer than --max-batched-tokens: shorter steps land pushes
    /// sooner under a full engine.
    #[arg(long, default_value_t = 256)]
    session_step_budget: usize,
    /// Tokens of a whole engine step while any request is decoding, if fewer than
    /// --max-batched-tokens: each decode token waits for its step's prefill chunks, so shorter
    /// steps keep inter-token latency down under load; a prompt with nothing decoding beside
    /// it still prefills in whole steps.
    #[arg(long, default_value_t = 256)]
    decode_step_budget: usize,
    /// Speculative decoding: `suffix` (drafts from the longest earlier match of the text's
    /// end in the context, a session's history or a request's prediction), `ngram` (vLLM's
    /// prompt lookup), `draft:PATH` (a smaller model of the same vocabulary drafts greedily;
    /// its KV takes as many tokens as the target's, beside --kv-memory) or `off`. Output is
    /// identical either way; a request may pick its own with `speculative`.
    #[arg(long, default_value = "suffix")]
    speculative: String,
    /// Most draft tokens a sequence verifies in one step.
    #[arg(long, default_value_t = 16)]
    speculative_max_draft: usize,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    max_seqs: usize,
    /// Requests allowed to wait beyond `--max-seqs`; past it, 503 with `Retry-After`.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Seconds a session may sit idle before it is deleted.
    #[arg(long, default_value_t = 3600.0)]
    session_ttl: f64,
    /// Seconds a stored response (`/v1/responses` with `store`, the default) is kept in memory
    /// for `previous_response_id`, with its chain's KV; 0 stores none.
    #[arg(long, default_value_t = 3600.0)]
    response_ttl: f64,
    /// Stored responses at most; past it the oldest go first.
    #[arg(long, default_value_t = 1024)]
    max_stored_responses: usize,
    /// Live sessions at most; creating one more is refused with 409.
    #[arg(long, default_value_t = 256)]
    max_sessions: usize,
    /// Bytes of pushed, not yet ingested session data held across all sessions, e.g. `256MiB`;
    /// a push past it is refused with 429 and `Retry-After`. A session's `max_pending_bytes`
    /// may not exceed it.
    #[arg(long, default_value = "256MiB")]
    max_pending_bytes_total: String,
    /// Where sessions are kept across restarts (a write-ahead log and snapshots): a push, a
    /// session's creation and its flash queries are acknowledged only once on disk. Default:
    /// `$VIGIL_HOME/state`. One server per directory (it is locked).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Keep sessions in memory only: a restart loses them (and acknowledgements wait for no
    /// disk).
    #[arg(long, conflicts_with_all = ["state_dir", "kv_disk"])]
    no_persist: bool,
    /// Disk for idle sessions' KV under the state directory, e.g. `8GiB` (0: off). A session
    /// whose KV has not changed for 2 s is written there, and a restart reads it back
    /// instead of recomputing it; past the budget the least recently written files go.
    #[arg(long, default_value = "0")]
    kv_disk: String,
    /// Turn the prefix cache off (to measure without it).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Leave the KV pool's memory unmapped until rows are written, instead of mapping all of
    /// it at start (less memory at first; requests then pay the page faults of every block
    /// the pool hands out for the first time).
    #[arg(long)]
    no_kv_prefault: bool,
    /// Require `Authorization: Bearer KEY` or `x-api-key: KEY` on every route but /health.
    #[arg(long, env = "VIGIL_API_KEY")]
    api_key: Option<String>,
    /// Largest request body accepted (bytes); larger gets 413.
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
    /// Open connections served at once; past it a connection gets 503 (or `/health`) and is
    /// closed. Default: the open-file limit less headroom.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a connection may take to send a complete request head, on connect and between
    /// keep-alive requests; then it is closed.
    #[arg(long, default_value_t = 30.0)]
    idle_timeout: f64,
    /// Seconds a write may wait on a client that does not read (a stalled stream); then the
    /// connection is closed and its generation cancelled.
    #[arg(long, default_value_t = 30.0)]
    write_timeout: f64,
    /// Kernel send buffer per connection, in bytes (SO_SNDBUF; default: the kernel's,
    /// autotuned up to net.ipv4.tcp_wmem). Bounds the memory a client that stops reading holds
    /// before --write-timeout starts counting.
    #[arg(long)]
    send_buffer_bytes: Option<usize>,
    /// Seconds in-flight requests may take to finish after SIGTERM before the process exits.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Browser origins allowed to call the API, comma-separated (`*` for any): they get CORS
    /// headers and preflights; requests from other origins are refused with 403.
    #[arg(long, default_value = "")]
    allowed_origins: String,
    /// Quantize float weights at load (`q8_0`).
    #[arg(long)]
    quantize: Option<String>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let model_path = crate::pull::model_or_default(args.model.as_deref())?;
    let kv_memory_bytes = match &args.kv_memory {
        Some(s) => {
            let bytes = parse_size(s).with_context(|| format!("--kv-memory {s}"))?;
            check_fits_memory(s, bytes)?;
            bytes
        }
        None => default_kv_memory(),
    };
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_bytes,
        max_queue: args.max_queue,
        max_seqs: args.max_seqs,
        session_ttl: std::time::Duration::from_secs_f64(args.session_ttl),
        max_sessions: args.max_sessions,
        response_ttl: std::time::Duration::from_secs_f64(args.response_ttl),
        max_stored_responses: args.max_stored_responses,
        conn: vigil_server::listener::ConnLimits {
            max_connections: args
                .max_connections
                .unwrap_or_else(vigil_server::listener::default_max_connections)
                .max(1),
            idle_timeout: seconds("--idle-timeout", args.idle_timeout)?,
            write_timeout: seconds("--write-timeout", args.write_timeout)?,
            send_buffer_bytes: args.send_buffer_bytes,
            shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout)?,
        },
        max_pending_bytes_total: parse_size(&args.max_pending_bytes_total)
            .with_context(|| format!("--max-pending-bytes-total {}", args.max_pending_bytes_total))?
            .max(1),
        allowed_origins: vigil_server::edge::AllowedOrigins::parse(&args.allowed_origins),
        kv_disk_bytes: parse_size(&args.kv_disk)
            .with_context(|| format!("--kv-disk {}", args.kv_disk))? as u64,
        state_dir: (!args.no_persist).then(|| {
            args.state_dir
                .unwrap_or_else(|| crate::pull::vigil_home().join("state"))
        }),
    };
    let opts = EngineOptions {
        model_path,
        served_model_name: args.served_model_name,
        load: LoadOptions {
            threads: args.threads,
            quantize: vigil_model::load::parse_quantize(args.quantize.as_deref())?,
            max_context: args.ctx,
        },
        kv_memory_bytes,
        block_size: 16,
        max_batched_tokens: args.max_batched_tokens,
        session_step_tokens: args.session_step_tokens.max(1),
        session_chunk_tokens: args.session_chunk_tokens.max(1),
        session_deadline_ms: args.session_deadline_ms,
        session_step_budget: args.session_step_budget.max(1),
        decode_step_budget: args.decode_step_budget.max(1),
        enable_prefix_cache: !args.no_prefix_cache,
        kv_prefault: !args.no_kv_prefault,
        speculative: speculative_config(&args.speculative, args.speculative_max_draft)?,
        draft_model: args.speculative.strip_prefix("draft:").map(PathBuf::from),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(vigil_server::serve(config, opts))?;
    Ok(())
}

fn speculative_config(method: &str, max_draft: usize) -> Result<SpecConfig> {
    let method = match method.strip_prefix("draft:") {
        Some("") => bail!("--speculative draft:PATH needs the draft model's path"),
        Some(_) => SpecMethod::Draft,
        None => match SpecMethod::parse(method) {
            Some(SpecMethod::Draft) | None => {
                bail!("--speculative {method}: expected off, ngram, suffix or draft:PATH")
            }
            Some(m) => m,
        },
    };
    Ok(SpecConfig {
        method,
        max_draft: max_draft.clamp(1, 32),
        ..SpecConfig::default()
    })
}

fn seconds(flag: &str, s: f64) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} must be a positive number of seconds, got {s}"))
}

/// `2GiB`, `512MiB`, `1G`, `300M`, `4096` (bytes).
fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .context("expected a number with an optional unit")?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        other => anyhow::bail!("unknown unit `{other}` (use KiB, MiB or GiB)"),
    };
    Ok((n * mult) as usize)
}

/// A `/proc/meminfo` field in bytes (`None` where there is no such file, e.g. not Linux).
fn meminfo(field: &str) -> Option<usize> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with(field))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn default_kv_memory() -> usize {
    let total = meminfo("MemTotal:").unwrap_or(8 << 30);
    (total / 10).min(2 << 30)
}

/// A KV budget the machine cannot hold is refused at start, not discovered when the pool
/// fills (with `--no-kv-prefault` the pool is mapped as it is written, so the kernel would
/// kill the server mid-request).
fn check_fits_memory(flag_value: &str, bytes: usize) -> Result<()> {
    let Some(available) = meminfo("MemAvailable:") else {
        return Ok(());
    };
    if bytes > available {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        anyhow::bail!(
            "--kv-memory {flag_value} ({:.1} GiB) is more than the memory available on this machine ({:.1} GiB); give a smaller budget",
            gib(bytes),
            gib(available)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(super::parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(super::parse_size("4096").unwrap(), 4096);
        assert!(super::parse_size("3 parsecs").is_err());
    }
}
