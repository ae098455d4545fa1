//! The unix-socket-only admin routes: `/admin/stats`, `/admin/drain` and
//! `/admin/cache/flush`, and the drain itself (also run on SIGTERM).
//!
//! A drain stops admitting, waits for the admitted requests on the `work` gauge (woken by
//! the last one, bounded by its deadline), cuts what remains, then demotes the whole
//! prompt cache to the SSD tier. It is terminal: a drained engine never serves again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_protocol::engine_wire::DrainResponse;
use corral_protocol::{ApiError, ErrorKind};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::app::App;
use super::body::Body;
use super::respond::{error_response, json_response};
use crate::scheduler::stats::Shown;

/// After a drain deadline cuts requests, how long they get to notice.
const CUT_GRACE: Duration = Duration::from_secs(5);

pub fn stats(app: &App) -> Response<Body> {
    let shown = Shown {
        max_queue: app.max_queue,
        batch: app.batch,
        ctx: app.ctx,
        kv_budget_bytes: app.kv_budget.bytes,
        memory_budget_bytes: app.memory_budget,
        model_file_bytes: app.engine.file_bytes,
        draining: app.draining.load(Ordering::SeqCst),
        device: app.engine.device_stats(),
    };
    json_response(serde_json::to_string(&app.stats.snapshot(&app.model_id, shown, &app.cache)).unwrap_or_default())
}

/// `POST /admin/drain[?timeout_ms=N]`: stop admitting, wait for queued and running
/// requests up to the deadline, cut what remains, demote the prompt cache.
pub async fn drain(app: &App, req: &Request<Incoming>) -> Response<Body> {
    let timeout = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("timeout_ms=")))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(app.default_drain, Duration::from_millis);
    let cancelled = drain_now(app, timeout).await;
    let demotions = demote_all(app).await;
    json_response(serde_json::to_string(&DrainResponse { drained: true, demotions, cancelled }).unwrap_or_default())
}

/// Stop admitting work and wait (up to `timeout`) for the admitted requests; returns
/// how many had to be cut.
pub async fn drain_now(app: &App, timeout: Duration) -> usize {
    app.draining.store(true, Ordering::SeqCst);
    if app.work.wait_zero(Instant::now() + timeout).await {
        return 0;
    }
    let left = app.work.get();
    tracing::warn!(left, "drain deadline: cancelling remaining requests");
    app.worker.cancel_all.store(true, Ordering::Relaxed);
    if !app.work.wait_zero(Instant::now() + CUT_GRACE).await {
        tracing::error!(left = app.work.get(), "requests still running after being cut");
    }
    left
}

/// Move every prompt-cache entry to the SSD tier (after a drain); returns how many are
/// now on disk.
pub async fn demote_all(app: &App) -> usize {
    let cache = app.cache.clone();
    let report = tokio::task::spawn_blocking(move || cache.flush(true)).await;
    report.map_or(0, |r| {
        tracing::info!(written = r.written, durable = r.durable, failed = r.failed, "prompt cache demoted");
        r.durable
    })
}

/// `POST /admin/cache/flush`: make every RAM entry durable on disk; entries stay in RAM.
pub async fn flush(app: &App) -> Response<Body> {
    let cache = app.cache.clone();
    match tokio::task::spawn_blocking(move || cache.flush(false)).await {
        Ok(r) => json_response(serde_json::to_string(&r).unwrap_or_default()),
        Err(e) => error_response(&ApiError::new(ErrorKind::Internal, format!("flush failed: {e}"))),
    }
}
