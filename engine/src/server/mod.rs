//! `corral engine`: the inference server for one model, HTTP/1.1 on a unix socket.
//!
//! The gateway only forwards bytes here, so this is the complete OpenAI-compatible
//! surface for its model (see `docs/api.md`), plus unix-socket-only admin routes. One
//! task per connection on a small tokio runtime (the accept loop is `corral-net`'s,
//! shared with the gateway); request parsing and tokenization on the blocking pool;
//! generation on the scheduler's own thread (`crate::scheduler`). Lifecycle: SIGTERM/SIGINT drain (finish
//! in-flight work up to a deadline, demote the prompt cache) and exit 0; stdin EOF (the
//! parent is gone) cuts work and exits at once; a second signal exits at once.

mod admin;
mod answer;
mod anthropic;
mod app;
mod body;
mod conversation;
mod errors;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod input;
mod openai_chat;
mod requests;
mod respond;
mod responses_api;
pub mod socket;
mod stream;
mod structured;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use corral_net::accept::{self, Server};
use corral_net::gauge::Gauge;
use corral_net::signals::{self, Stop};
use corral_net::{CancellationToken, TaskTracker};
use corral_protocol::engine_wire::{EngineEvent, Ready};
use corral_protocol::http_limits;
use tokio::sync::oneshot;

pub use requests::{ModelSamplingDefaults, ServerDefaults};

use crate::Engine;
use crate::scheduler::{admission, stats, worker};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub socket: PathBuf,
    pub model_id: String,
    /// Context size (prompt + generation) per request.
    pub ctx: usize,
    /// Requests waiting beyond the running ones; more are refused with 429.
    pub max_queue: usize,
    /// Requests generated together, one forward pass for all (`--batch`; 1 = serial).
    pub batch: usize,
    /// Memory budget in bytes (`--memory-budget`; default 0.75 × RAM).
    pub memory_budget: u64,
    /// KV budget in bytes (`--kv-budget`); `None`: the memory budget less the model file.
    pub kv_budget: Option<u64>,
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

/// How long open connections get to flush their last bytes at exit.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Serve `engine` until told to stop. Returns after the socket file is removed.
pub fn run(engine: Engine, cfg: ServerConfig, load_ms: u64) -> Result<(), ServeError> {
    let listener = socket::bind(&cfg.socket)?;
    let engine = Arc::new(engine);
    let stats = Arc::new(stats::Stats::new());
    let cache =
        crate::cache::PromptCache::new(cfg.cache.clone(), engine.model.kv_shape(), Some(engine.cache_identity()));
    // On a GPU every admitted row's KV is also mirrored in device memory: the budget is
    // the smaller of what RAM and the GPU can hold.
    let host_kv = cfg.kv_budget.unwrap_or_else(|| cfg.memory_budget.saturating_sub(engine.file_bytes));
    let kv_budget = admission::KvBudget {
        bytes: engine.model.device_kv_capacity().map_or(host_kv, |d| host_kv.min(d)),
        per_token: engine.model.kv_shape().bytes_per_token() as u64,
        state_bytes: engine.model.recurrent_shape().map_or(0, |r| r.bytes() as u64),
    };
    tracing::info!(
        device = %engine.model.device().label(),
        weight_bytes = engine.file_bytes,
        kv_bytes_per_token = kv_budget.per_token,
        recurrent_state_bytes = kv_budget.state_bytes,
        kv_budget_bytes = kv_budget.bytes,
        max_context_in_budget = kv_budget.max_tokens(),
        batch = cfg.batch,
        "memory fit"
    );
    let wcfg = worker::WorkerConfig { ctx: cfg.ctx, max_queue: cfg.max_queue, batch: cfg.batch, kv: kv_budget };
    let worker = worker::Worker::spawn(engine.clone(), cache.clone(), wcfg, stats.clone())?;
    if cfg.defaults.speculate != crate::speculate::Speculate::Off && !engine.model.speculates() {
        tracing::warn!("--speculate is ignored for this model (a hybrid: docs/speculation.md)");
    }
    let model_defaults = model_defaults(&engine);
    let app = Arc::new(app::App {
        defaults: requests::EffectiveDefaults::new(&cfg.defaults, &model_defaults),
        engine,
        worker,
        cache,
        stats,
        model_id: cfg.model_id.clone(),
        ctx: cfg.ctx,
        max_queue: cfg.max_queue,
        batch: cfg.batch,
        kv_budget,
        memory_budget: cfg.memory_budget,
        max_body_bytes: cfg.max_body_bytes,
        created: respond::unix_now(),
        default_drain: cfg.drain_timeout,
        draining: AtomicBool::new(false),
        work: Gauge::new(),
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
    app: Arc<app::App>,
    listener: std::os::unix::net::UnixListener,
    cfg: &ServerConfig,
    load_ms: u64,
) -> Result<(), ServeError> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let mut stops = signals::watch()?;
    let mut parent_gone = watch_stdin();
    let ready = EngineEvent::Ready(Ready {
        pid: std::process::id(),
        socket: cfg.socket.display().to_string(),
        model: cfg.model_id.clone(),
        load_ms,
        device: app.engine.model.device().label(),
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready.to_line())?;
        out.flush()?;
    }
    tracing::info!(socket = %cfg.socket.display(), model = %cfg.model_id, load_ms, "engine ready");
    let server = Server {
        max_connections: http_limits::MAX_CONNECTIONS,
        header_timeout: http_limits::HEADER_READ_TIMEOUT,
        stop: CancellationToken::new(),
        tasks: TaskTracker::new(),
    };
    let handler_app = app.clone();
    server.tasks.spawn(accept::serve(listener, server.clone(), move |req| http::handle(handler_app.clone(), req)));
    tokio::select! {
        stop = stops.recv() => match stop {
            Some(Stop::Graceful) | None => {
                tracing::info!("signal: draining, then exiting");
                tokio::select! {
                    left = admin::drain_now(&app, cfg.shutdown_timeout) => {
                        let demoted = admin::demote_all(&app).await;
                        tracing::info!(cancelled = left, demoted, "drained");
                    }
                    _ = stops.recv() => tracing::warn!("second stop request: exiting now"),
                    _ = &mut parent_gone => tracing::warn!("stdin closed during the drain: exiting now"),
                }
            }
            Some(Stop::Fast) => tracing::warn!("fast stop: exiting now"),
        },
        _ = &mut parent_gone => {
            tracing::info!("stdin closed (parent gone): exiting");
            app.draining.store(true, Ordering::SeqCst);
            app.worker.cancel_all.store(true, Ordering::Relaxed);
        }
    }
    // Let responses in progress reach their clients, then close.
    server.stop.cancel();
    server.tasks.close();
    if tokio::time::timeout(CLOSE_GRACE, server.tasks.wait()).await.is_err() {
        tracing::debug!("connections still open at exit");
    }
    Ok(())
}

/// The parent holds our stdin open; EOF means it is gone (works where no parent-death
/// signal exists, e.g. macOS).
fn watch_stdin() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    let _ = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        let _ = tx.send(());
    });
    rx
}
