//! The public HTTP server: TCP accept loop, limits, routes answered here
//! (`/health`, `/engine`, `/stats`, `/v1/models`), proxied routes, and shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use corral_pool::{Pool, unix_http};
use corral_protocol::{ApiError, ErrorKind, http_limits};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::sync::mpsc;

use crate::body::Body;
use crate::proxy;
use crate::stats::GatewayStats;

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub addr: SocketAddr,
    pub max_body_bytes: usize,
    /// No response head from an engine within this: 504 and the engine is recycled.
    pub engine_timeout: Duration,
    /// No body bytes from an engine for this long mid-response: the response is cut.
    pub stall_timeout: Duration,
    /// How long shutdown lets in-flight requests finish.
    pub drain_timeout: Duration,
    /// Per-engine timeout when `/stats` asks each engine for its counters.
    pub stats_timeout: Duration,
    /// Start these models' engines at startup.
    pub preload: Vec<String>,
}

pub struct App {
    pub cfg: GatewayConfig,
    pub pool: Pool,
    pub stats: Arc<GatewayStats>,
    pub stopping: AtomicBool,
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = Response::new(Body::full(e.to_json()));
    *r.status_mut() = StatusCode::from_u16(e.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(s) = e.kind.retry_after_secs() {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn json_response(v: String) -> Response<Body> {
    let mut r = Response::new(Body::full(v));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Routes forwarded to the model's engine.
const PROXIED: &[&str] = &["/v1/chat/completions", "/v1/completions", "/apply-template"];

async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let route = if PROXIED.contains(&path.as_str())
        || matches!(path.as_str(), "/health" | "/engine" | "/stats" | "/v1/models")
    {
        path.clone()
    } else {
        "other".to_owned()
    };
    let resp = dispatch(&app, req, &method, &path).await;
    app.stats.count(&route, resp.status().as_u16());
    resp
}

async fn dispatch(app: &Arc<App>, req: Request<Incoming>, method: &Method, path: &str) -> Response<Body> {
    let get_only = matches!(path, "/health" | "/engine" | "/stats" | "/v1/models");
    let post_only = PROXIED.contains(&path);
    if !get_only && !post_only {
        // `/admin/*` lives on engine sockets only; it is never served here.
        return error_response(&ApiError::new(ErrorKind::NotFound, format!("no route {path}")));
    }
    if (get_only && method != Method::GET) || (post_only && method != Method::POST) {
        let mut r =
            error_response(&ApiError::new(ErrorKind::MethodNotAllowed, format!("{method} is not allowed on {path}")));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(if get_only { "GET" } else { "POST" }));
        return r;
    }
    if app.stopping.load(Ordering::Relaxed) && post_only {
        let mut r = error_response(&ApiError::new(ErrorKind::ShuttingDown, "the server is shutting down"));
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    match path {
        "/health" => json_response(r#"{"status":"ok"}"#.into()),
        "/engine" => json_response(serde_json::to_string(&app.pool.snapshot()).unwrap_or_default()),
        "/v1/models" => json_response(serde_json::to_string(&app.pool.models()).unwrap_or_default()),
        "/stats" => stats(app).await,
        _ => proxy::forward(app.clone(), req).await,
    }
}

/// Gateway counters plus each ready engine's own; a slow or dead engine is marked
/// stale after `stats_timeout` instead of holding the answer up.
async fn stats(app: &Arc<App>) -> Response<Body> {
    let gateway = app.stats.view(app.pool.counters());
    let timeout = app.cfg.stats_timeout;
    let queries = app.pool.ready_sockets().into_iter().map(|(model, socket)| async move {
        let v = match unix_http::call(&socket, "GET", "/admin/stats", Bytes::new(), timeout).await {
            Ok((200, body)) => {
                serde_json::from_slice(&body).unwrap_or_else(|e| json!({"stale": true, "error": e.to_string()}))
            }
            Ok((status, _)) => json!({"stale": true, "error": format!("status {status}")}),
            Err(e) => json!({"stale": true, "error": e.to_string()}),
        };
        (model, v)
    });
    let handles: Vec<_> = queries.map(tokio::spawn).collect();
    let mut engines = serde_json::Map::new();
    for h in handles {
        if let Ok((m, v)) = h.await {
            engines.insert(m, v);
        }
    }
    json_response(json!({"gateway": gateway, "engines": engines}).to_string())
}

enum Stop {
    Graceful,
    Fast,
}

/// Bind, announce, serve until SIGTERM/SIGINT; returns the process exit code.
pub async fn run(cfg: GatewayConfig, pool: Pool) -> std::io::Result<i32> {
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    let addr = listener.local_addr()?;
    let app = Arc::new(App { cfg, pool, stats: Arc::new(GatewayStats::new()), stopping: AtomicBool::new(false) });
    let (stop_tx, mut stop_rx) = mpsc::unbounded_channel();
    watch_signals(stop_tx)?;
    println!("{}", json!({"event": "listening", "addr": addr.to_string(), "pid": std::process::id()}));
    tracing::info!(addr = %addr, "gateway listening");
    for m in app.cfg.preload.clone() {
        let pool = app.pool.clone();
        tokio::spawn(async move {
            if let Err(e) = pool.preload(&m).await {
                tracing::error!(model = %m, error = %e, "preload failed");
            }
        });
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let app = app.clone();
                            async move { Ok::<_, Infallible>(handle(app, req).await) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(http_limits::HEADER_READ_TIMEOUT)
                            .max_headers(http_limits::MAX_HEADERS)
                            .max_buf_size(http_limits::MAX_HEAD_BYTES)
                            .serve_connection(TokioIo::new(stream), svc);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "client connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            stop = stop_rx.recv() => {
                drop(listener);
                return Ok(match stop {
                    Some(Stop::Graceful) | None => shutdown(&app, &mut stop_rx).await,
                    Some(Stop::Fast) => {
                        app.pool.kill_all();
                        130
                    }
                });
            }
        }
    }
}

/// Stop accepting, let in-flight requests finish (bounded), stop every engine. A second
/// signal during this kills the engines and exits at once.
async fn shutdown(app: &Arc<App>, stop_rx: &mut mpsc::UnboundedReceiver<Stop>) -> i32 {
    tracing::info!("shutting down: finishing in-flight requests");
    app.stopping.store(true, Ordering::Relaxed);
    let graceful = async {
        let deadline = tokio::time::Instant::now() + app.cfg.drain_timeout;
        while app.stats.in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        app.pool.shutdown().await;
    };
    tokio::select! {
        _ = graceful => {
            tracing::info!("all engines stopped");
            0
        }
        _ = stop_rx.recv() => {
            tracing::warn!("second signal: killing engines");
            app.pool.kill_all();
            130
        }
    }
}

fn watch_signals(tx: mpsc::UnboundedSender<Stop>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut first = true;
        for _ in signals.forever() {
            let stop = if first { Stop::Graceful } else { Stop::Fast };
            first = false;
            if tx.send(stop).is_err() {
                break;
            }
        }
    })?;
    Ok(())
}
