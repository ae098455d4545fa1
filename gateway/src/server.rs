//! The gateway process: bind, announce, serve until a signal, shut down.
//!
//! Shutdown (first SIGTERM/SIGINT): stop accepting and admitting (`App::stop`), then at
//! the same time stop every engine (each drains — finishing its requests up to
//! `--drain-timeout` and writing its prompt cache to the SSD tier — then exits) and wait
//! for the proxied requests in flight to deliver their last byte (the gauge), then let
//! the client connections close. A second signal kills the engines (`Pool::kill_all`:
//! SIGKILL through the one stop path, drains in progress included) and exits.

use std::sync::Arc;
use std::time::Duration;

use corral_net::TaskTracker;
use corral_net::accept::{Server, serve};
use corral_net::signals::{self, Stop};
use corral_pool::Pool;
use serde_json::json;
use tokio::sync::mpsc;

use crate::app::{App, GatewayConfig};
use crate::routes;

/// How long closing client connections may take once all responses are complete.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Bind, announce, serve until SIGTERM/SIGINT; returns the process exit code. A
/// non-loopback address without an API key is refused before anything is bound.
pub async fn run(cfg: GatewayConfig, pool: Pool) -> std::io::Result<i32> {
    crate::auth::check_exposure(cfg.addr.ip(), cfg.api_key.is_some(), cfg.insecure_no_api_key)
        .map_err(std::io::Error::other)?;
    if cfg.api_key.is_none() && !cfg.addr.ip().is_loopback() {
        tracing::warn!(addr = %cfg.addr, "serving without an API key on a non-loopback address (--insecure-no-api-key)");
    }
    let upstreams = crate::upstream::Upstreams::new(cfg.upstreams.clone()).map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    let addr = listener.local_addr()?;
    let mut stops = signals::watch()?;
    let app = App::new(cfg, pool, upstreams, addr);
    let tasks = TaskTracker::new();
    println!("{}", json!({"event": "listening", "addr": addr.to_string(), "pid": std::process::id()}));
    tracing::info!(addr = %addr, api_key = app.cfg.api_key.is_some(), cors = app.cfg.cors.enabled(), "gateway listening");
    if app.cfg.open_ui {
        crate::open::open_in_browser(&crate::open::chat_url(addr));
    }
    for up in &app.upstreams.0 {
        let urls: Vec<String> = up.replicas.iter().map(|r| r.base.to_string()).collect();
        tracing::info!(model = up.id(), replicas = ?urls, upstream_model = up.spec.remote_name(), "upstream model");
        // Not on `tasks`: the checks end with the stop token, before connections close.
        tokio::spawn(crate::upstream::checker::run(up.clone(), app.stop.clone()));
    }
    // Upstream models are not started here: their servers are not ours.
    let local: Vec<String> = app.cfg.preload.iter().filter(|m| app.upstreams.find(m).is_none()).cloned().collect();
    for m in local {
        let pool = app.pool.clone();
        tasks.spawn(async move {
            if let Err(e) = pool.preload(&m).await {
                tracing::error!(model = %m, error = %e, "preload failed");
            }
        });
    }
    let server = Server {
        max_connections: app.cfg.max_connections,
        header_timeout: app.cfg.header_timeout,
        stop: app.stop.clone(),
        tasks: tasks.clone(),
    };
    let handler_app = app.clone();
    tasks.spawn(serve(listener, server, move |req| routes::handle(handler_app.clone(), req)));
    Ok(match stops.recv().await {
        Some(Stop::Fast) => {
            app.pool.kill_all().await;
            130
        }
        Some(Stop::Graceful) | None => shutdown(&app, &mut stops, tasks).await,
    })
}

async fn shutdown(app: &Arc<App>, stops: &mut mpsc::UnboundedReceiver<Stop>, tasks: TaskTracker) -> i32 {
    tracing::info!(in_flight = app.in_flight.get(), "shutting down: finishing requests, stopping engines");
    app.stop.cancel();
    let graceful = async {
        let deadline = tokio::time::Instant::now() + app.cfg.drain_timeout;
        let (_, drained) = tokio::join!(app.pool.shutdown(), app.in_flight.wait_zero(deadline));
        if !drained {
            tracing::warn!(left = app.in_flight.get(), "requests still in flight at the drain deadline");
        }
        app.responses.flush().await;
        tasks.close();
        if tokio::time::timeout(CLOSE_GRACE, tasks.wait()).await.is_err() {
            tracing::warn!("client connections still open; exiting anyway");
        }
    };
    tokio::select! {
        _ = graceful => {
            tracing::info!("all engines stopped");
            0
        }
        _ = stops.recv() => {
            tracing::warn!("second signal: killing engines");
            app.pool.kill_all().await;
            130
        }
    }
}
