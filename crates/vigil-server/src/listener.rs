//! The accept loop: HTTP/1.1 connections with a header-read deadline (which also bounds the
//! idle time between keep-alive requests), a write deadline (a client that stops reading is
//! disconnected, which cancels its request), a cap on open connections, and graceful shutdown
//! with a deadline at which every open stream gets a final frame.
//!
//! Past the cap a connection is not given to the router: it gets one short answer on a small
//! budget (`/health` still answers, anything else is a 503 with `Retry-After`) and is closed,
//! so idle sockets can neither take the fd table nor stop the health check from answering.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections served by the router at once.
    pub max_connections: usize,
    /// Time to send a complete request head, on a new connection and between keep-alive
    /// requests alike; then the connection is closed.
    pub idle_timeout: Duration,
    /// How long a write may wait for a client that does not read; then the connection is
    /// closed (and its generation cancelled).
    pub write_timeout: Duration,
    /// `SO_SNDBUF` for each connection (`None`: the kernel's, autotuned): what a client that
    /// stops reading can hold in kernel memory before `write_timeout` starts counting.
    pub send_buffer_bytes: Option<usize>,
    /// After SIGTERM, how long in-flight requests may take before the process exits anyway.
    pub shutdown_timeout: Duration,
}

/// Connections past the cap answered at once; beyond these they are closed unanswered.
const OVERFLOW_ANSWERS: usize = 64;
/// How long an over-cap connection may take to send its request line.
const OVERFLOW_READ: Duration = Duration::from_millis(500);
/// After the shutdown deadline, how long streams get to write their final frame.
const FINAL_FRAME_GRACE: Duration = Duration::from_secs(1);

/// What an over-cap connection asking for `/health` gets: status and JSON body.
pub type HealthProbe = Arc<dyn Fn() -> (u16, String) + Send + Sync>;

/// The default `--max-connections`: the process's open-file limit less headroom for the model
/// files, logs and the engine (at least 64).
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    soft.saturating_sub(soft / 8 + 64 + OVERFLOW_ANSWERS)
        .max(64)
}

/// Serve `app` on `listener` until `shutdown` resolves, then stop accepting, let open requests
/// finish for up to `limits.shutdown_timeout`, call `end_streams` (each open stream writes its
/// final frame and ends) and return (`open` counts the connections).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    open: Arc<AtomicU64>,
    health: HealthProbe,
    shutdown: impl Future<Output = ()>,
    end_streams: impl FnOnce(),
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of fds or a connection reset before accept: back off, keep serving.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        if let Some(n) = limits.send_buffer_bytes {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(n);
        }
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let (app, open, stop) = (app.clone(), open.clone(), stop_rx.clone());
                tokio::spawn(async move {
                    open.fetch_add(1, Ordering::Relaxed);
                    serve_connection(stream, app, limits, stop).await;
                    open.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
            Err(_) => match overflow.clone().try_acquire_owned() {
                Ok(permit) => {
                    let health = health.clone();
                    tokio::spawn(async move {
                        answer_over_capacity(stream, &health).await;
                        drop(permit);
                    });
                }
                Err(_) => drop(stream),
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let drained = slots.acquire_many(all);
    tokio::pin!(drained);
    if tokio::time::timeout(limits.shutdown_timeout, &mut drained)
        .await
        .is_ok()
    {
        tracing::info!("every connection closed");
        return Ok(());
    }
    tracing::warn!(
        "shutdown deadline ({:?}) passed with {} connection(s) open; ending their streams",
        limits.shutdown_timeout,
        open.load(Ordering::Relaxed)
    );
    end_streams();
    if tokio::time::timeout(FINAL_FRAME_GRACE, &mut drained)
        .await
        .is_err()
    {
        tracing::warn!(
            "{} connection(s) still open (not reading); exiting",
            open.load(Ordering::Relaxed)
        );
    }
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let service = TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .keep_alive(true);
    // A write that makes no progress for `write_timeout` fails the connection: hyper then
    // drops the response body, and with it the generation feeding it. Reads are bounded by
    // the header timer (heads) and by each route (bodies, WebSocket pings).
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.write_timeout));
    let conn = builder
        .serve_connection(TokioIo::new(Box::pin(io)), service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                // Finish the request in flight, then close instead of keeping alive.
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// One short answer for a connection past the cap: `GET /health` is served (a supervisor must
/// still see the server), anything else gets 503, then the connection is closed.
async fn answer_over_capacity(mut stream: TcpStream, health: &HealthProbe) {
    let mut head = [0u8; 64];
    let n = tokio::time::timeout(OVERFLOW_READ, stream.read(&mut head))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let line = &head[..n];
    let (status, body) = if line.starts_with(b"GET /health ") || line.starts_with(b"GET /healthz ")
    {
        health()
    } else {
        let body = serde_json::json!({"error": {
            "message": "the server has as many open connections as it keeps (--max-connections); retry later",
            "type": "overloaded_error",
        }});
        (503, body.to_string())
    };
    let reason = match status {
        200 => "OK",
        _ => "Service Unavailable",
    };
    let reply = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\nserver: vigil/{}\r\n\r\n{body}",
        body.len(),
        env!("CARGO_PKG_VERSION"),
    );
    let _ = tokio::time::timeout(OVERFLOW_READ, stream.write_all(reply.as_bytes())).await;
    let _ = stream.shutdown().await;
}
