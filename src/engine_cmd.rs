//! `corral engine`: the child process the pool starts, one per model. Not usually run
//! by hand (it exits when its stdin closes). Exit codes: 0 clean stop, 78 configuration
//! error (model cannot be loaded, socket directory unusable), 1 anything else.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use corral_engine::server::{ServeError, ServerConfig, ServerDefaults};
use corral_engine::{Engine, threads};
use corral_protocol::ModelId;

/// EX_CONFIG from sysexits.h: the pool does not retry it.
pub const EXIT_CONFIG: u8 = 78;

#[derive(Args)]
pub struct EngineArgs {
    /// Model file (GGUF).
    #[arg(long)]
    model: PathBuf,
    /// Model id to serve under (default: the file stem).
    #[arg(long)]
    id: Option<String>,
    /// Unix socket to listen on; its directory must be private (0700) or absent.
    #[arg(long)]
    socket: PathBuf,
    /// Context size per request (prompt + generation); default min(4096, the model's).
    #[arg(long, env = "CORRAL_CTX")]
    ctx: Option<usize>,
    /// Requests allowed to wait behind the running one before 429 queue_full.
    #[arg(long, default_value_t = 64, env = "CORRAL_MAX_QUEUE")]
    max_queue: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Default temperature for requests that omit it.
    #[arg(long, alias = "temp")]
    temperature: Option<f32>,
    /// Default top-p for requests that omit it.
    #[arg(long)]
    top_p: Option<f32>,
    /// Default top-k for requests that omit it.
    #[arg(long)]
    top_k: Option<usize>,
    /// Default min-p for requests that omit it.
    #[arg(long)]
    min_p: Option<f32>,
    /// Default max_tokens for requests that omit it (unset: until the context is full).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Milliseconds SIGTERM waits for in-flight requests before cutting them.
    #[arg(long, default_value_t = 10_000)]
    shutdown_timeout_ms: u64,
    /// Default deadline of POST /admin/drain, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Compute threads (default: physical cores).
    #[arg(long, env = "CORRAL_THREADS")]
    threads: Option<usize>,
}

/// Runs the engine; returns the process exit code.
pub fn engine(args: EngineArgs) -> u8 {
    threads::init(args.threads);
    // A panic must end the process (the supervisor sees a crash, not a zombie engine).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    let stem = args.model.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_owned();
    let id = match ModelId::new(args.id.clone().unwrap_or(stem)) {
        Ok(id) => id,
        Err(e) => return fail(EXIT_CONFIG, &format!("bad model id: {e}")),
    };
    let engine = match Engine::load(&args.model) {
        Ok(e) => e,
        Err(e) => return fail(EXIT_CONFIG, &e.to_string()),
    };
    let load_ms = engine.load_time.as_millis() as u64;
    let ctx = args.ctx.unwrap_or(4096).min(engine.config().ctx_train).max(16);
    let cfg = ServerConfig {
        socket: args.socket,
        model_id: id.to_string(),
        ctx,
        max_queue: args.max_queue,
        max_body_bytes: args.max_body_bytes,
        defaults: ServerDefaults {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            max_tokens: args.max_tokens,
        },
        shutdown_timeout: Duration::from_millis(args.shutdown_timeout_ms),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
    };
    match corral_engine::server::run(engine, cfg, load_ms) {
        Ok(()) => 0,
        Err(ServeError::Socket(e)) => fail(EXIT_CONFIG, &e.to_string()),
        Err(e) => fail(1, &e.to_string()),
    }
}

fn fail(code: u8, msg: &str) -> u8 {
    tracing::error!(error = msg, "engine failed");
    eprintln!("corral engine: error: {msg}");
    code
}
