//! `corral engine`: the inference server for one model, HTTP/1.1 on a unix socket.
//!
//! The gateway only forwards bytes here, so this is the complete OpenAI-compatible
//! surface for its model (see `docs/api.md`), plus unix-socket-only admin routes. One
//! task per connection on a small tokio runtime; generation on its own thread
//! (`worker`). Lifecycle: SIGTERM/SIGINT drain (finish in-flight work up to a
//! deadline) and exit 0; stdin EOF (the parent is gone) cuts work and exits at once;
//! a second signal exits at once.

mod body;
mod http;
mod requests;
mod responses;
pub mod socket;
mod stats;
mod worker;

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_protocol::engine_wire::{EngineEvent, Ready};
use corral_protocol::http_limits;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::mpsc;

pub use requests::{ModelSamplingDefaults, ServerDefaults};

use crate::Engine;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub socket: PathBuf,
    pub model_id: String,
    /// Context size (prompt + generation) per request.
    pub ctx: usize,
    /// Requests waiting beyond the running one; more are refused with 429.
    pub max_queue: usize,
    pub max_body_bytes: usize,
    pub defaults: ServerDefaults,
    /// How long SIGTERM waits for in-flight work before cutting it.
    pub shutdown_timeout: Duration,
    /// Default deadline of `POST /admin/drain`.
    pub drain_timeout: Duration,
    pub cache: crate::cache::CacheConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    #[error("engine runtime: {0}")]
    Io(#[from] std::io::Error),
}

enum Stop {
    Signal,
    ParentGone,
}

/// Serve `engine` until told to stop. Returns after the socket file is removed.
pub fn run(engine: Engine, cfg: ServerConfig, load_ms: u64) -> Result<(), ServeError> {
    let listener = socket::bind(&cfg.socket)?;
    let engine = Arc::new(engine);
    let stats = Arc::new(stats::Stats::new());
    let cache =
        crate::cache::PromptCache::new(cfg.cache.clone(), engine.model.kv_shape(), Some(engine.cache_identity()));
    let worker = worker::Worker::spawn(engine.clone(), cache.clone(), cfg.ctx, cfg.max_queue, stats.clone())?;
    let model_defaults = model_defaults(&engine);
    let app = Arc::new(http::App {
        defaults: requests::EffectiveDefaults::new(&cfg.defaults, &model_defaults),
        engine,
        worker,
        cache,
        stats,
        model_id: cfg.model_id.clone(),
        ctx: cfg.ctx,
        max_queue: cfg.max_queue,
        max_body_bytes: cfg.max_body_bytes,
        created: responses::unix_now(),
        default_drain: cfg.drain_timeout,
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = rt.block_on(serve(app, listener, &cfg, load_ms));
    let _ = std::fs::remove_file(&cfg.socket);
    result
}

fn model_defaults(engine: &Engine) -> ModelSamplingDefaults {
    let s = &engine.sampling_metadata;
    ModelSamplingDefaults { temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, min_p: s.min_p }
}

async fn serve(
    app: Arc<http::App>,
    listener: std::os::unix::net::UnixListener,
    cfg: &ServerConfig,
    load_ms: u64,
) -> Result<(), ServeError> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let (stop_tx, mut stop_rx) = mpsc::unbounded_channel();
    watch_signals(stop_tx.clone())?;
    watch_stdin(stop_tx);
    let ready = EngineEvent::Ready(Ready {
        pid: std::process::id(),
        socket: cfg.socket.display().to_string(),
        model: cfg.model_id.clone(),
        load_ms,
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready.to_line())?;
        out.flush()?;
    }
    tracing::info!(socket = %cfg.socket.display(), model = %cfg.model_id, load_ms, "engine ready");
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let app = app.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let app = app.clone();
                            async move { Ok::<_, Infallible>(http::handle(app, req).await) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(http_limits::HEADER_READ_TIMEOUT)
                            .max_headers(http_limits::MAX_HEADERS)
                            .max_buf_size(http_limits::MAX_HEAD_BYTES)
                            .serve_connection(TokioIo::new(stream), svc);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            stop = stop_rx.recv() => {
                match stop {
                    Some(Stop::Signal) | None => {
                        tracing::info!("signal: draining, then exiting");
                        tokio::select! {
                            left = http::drain_now(&app, cfg.shutdown_timeout) => {
                                let demoted = http::demote_all(&app).await;
                                tracing::info!(cancelled = left, demoted, "drained");
                            }
                            _ = stop_rx.recv() => tracing::warn!("second stop request: exiting now"),
                        }
                    }
                    Some(Stop::ParentGone) => {
                        tracing::info!("stdin closed (parent gone): exiting");
                        app.stats.draining.store(true, Ordering::Relaxed);
                        app.worker.cancel_all.store(true, Ordering::Relaxed);
                    }
                }
                return Ok(());
            }
        }
    }
}

fn watch_signals(tx: mpsc::UnboundedSender<Stop>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for _ in signals.forever() {
            if tx.send(Stop::Signal).is_err() {
                break;
            }
        }
    })?;
    Ok(())
}

/// The parent holds our stdin open; EOF means it is gone (works where no parent-death
/// signal exists, e.g. macOS).
fn watch_stdin(tx: mpsc::UnboundedSender<Stop>) {
    let _ = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        let _ = tx.send(Stop::ParentGone);
    });
}
