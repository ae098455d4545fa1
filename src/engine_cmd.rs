//! `corral engine`: the child process the pool starts, one per model. Not usually run
//! by hand (it exits when its stdin closes). Exit codes: 0 clean stop, 78 configuration
//! error (model cannot be loaded, socket directory unusable), 1 anything else.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use corral_engine::cache::{CacheConfig, SsdConfig};
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
    #[command(flatten)]
    sampling: GenDefaultsArgs,
    /// Milliseconds SIGTERM waits for in-flight requests before cutting them.
    #[arg(long, default_value_t = 10_000)]
    shutdown_timeout_ms: u64,
    /// Default deadline of POST /admin/drain, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Compute threads (default: physical cores).
    #[arg(long, env = "CORRAL_THREADS")]
    threads: Option<usize>,
    /// Keep prompt-cache entries on disk in this directory (SSD tier; off by default
    /// for a bare engine, on by default under `corral serve`).
    #[arg(long, value_name = "DIR")]
    ssd_cache: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

/// Sampling defaults for requests that omit a field (shared by `engine` and `serve`,
/// which passes them on).
#[derive(Args, Clone, Debug)]
pub struct GenDefaultsArgs {
    /// Default temperature for requests that omit it (0-5).
    #[arg(long, alias = "temp", value_parser = in_range(0.0, 5.0))]
    pub temperature: Option<f32>,
    /// Default top-p for requests that omit it (0-1).
    #[arg(long, value_parser = in_range(0.0, 1.0))]
    pub top_p: Option<f32>,
    /// Default top-k for requests that omit it (0-1000000; 0 = off).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub top_k: Option<u32>,
    /// Default min-p for requests that omit it (0-1).
    #[arg(long, value_parser = in_range(0.0, 1.0))]
    pub min_p: Option<f32>,
    /// Default max_tokens for requests that omit it (unset: chat until the context is
    /// full, raw completions 512).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Constrained decoding (structured output, tool calls): `off` states constraints
    /// in the prompt instead and marks responses with a Warning header.
    #[arg(long, value_name = "on|off", default_value = "on", env = "CORRAL_GRAMMAR", value_parser = on_off, action = clap::ArgAction::Set)]
    pub grammar: bool,
}

/// A float flag bounded to `[lo, hi]`; the error names the range.
fn in_range(lo: f32, hi: f32) -> impl Fn(&str) -> Result<f32, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
        if v.is_finite() && (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be between {lo} and {hi} (got {s})"))
        }
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        _ => Err(format!("expected on or off (got {s:?})")),
    }
}

impl GenDefaultsArgs {
    fn defaults(&self) -> ServerDefaults {
        ServerDefaults {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(|k| k as usize),
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            grammar_off: !self.grammar,
        }
    }

    /// The flags that are set, as `corral engine` arguments.
    pub fn to_engine_args(&self) -> Vec<String> {
        let set = [
            ("--temperature", self.temperature.map(|v| v.to_string())),
            ("--top-p", self.top_p.map(|v| v.to_string())),
            ("--top-k", self.top_k.map(|v| v.to_string())),
            ("--min-p", self.min_p.map(|v| v.to_string())),
            ("--max-tokens", self.max_tokens.map(|v| v.to_string())),
            ("--grammar", (!self.grammar).then(|| "off".to_owned())),
        ];
        set.into_iter().filter_map(|(f, v)| v.map(|v| [f.to_owned(), v])).flatten().collect()
    }
}

/// Prompt-cache flags (shared by `engine` and `serve`, which passes them on).
#[derive(Args, Clone, Debug)]
pub struct CacheArgs {
    /// RAM for the prompt cache, in GB (0 turns the prompt cache off).
    #[arg(long, value_name = "GB", default_value_t = 8.0, env = "CORRAL_PROMPT_CACHE")]
    pub prompt_cache: f64,
    /// SSD cap, in GB.
    #[arg(long, value_name = "GB", default_value_t = 32.0, env = "CORRAL_SSD_CACHE_MAX")]
    pub ssd_cache_max: f64,
    /// Check every tensor checksum on every restore (default: once per file per process).
    #[arg(long)]
    pub ssd_cache_verify: bool,
    /// Entries unused this many seconds leave RAM for the SSD tier.
    #[arg(long, value_name = "SEC", default_value_t = 300)]
    pub ssd_demote_idle: u64,
    /// Idle milliseconds after a request before new entries are written behind.
    #[arg(long, value_name = "MS", default_value_t = 2000, hide = true)]
    pub ssd_write_behind_ms: u64,
}

impl CacheArgs {
    pub fn config(&self, ssd_dir: Option<PathBuf>) -> CacheConfig {
        CacheConfig {
            ram_bytes: (self.prompt_cache.max(0.0) * 1e9) as u64,
            ssd: ssd_dir.map(|dir| SsdConfig {
                dir,
                max_bytes: (self.ssd_cache_max.max(0.0) * 1e9) as u64,
                verify: self.ssd_cache_verify,
            }),
            demote_idle: Duration::from_secs(self.ssd_demote_idle),
            write_behind_after: Duration::from_millis(self.ssd_write_behind_ms),
        }
    }

    /// The same flags as `corral engine` arguments.
    pub fn to_engine_args(&self) -> Vec<String> {
        let mut v = vec![
            "--prompt-cache".into(),
            self.prompt_cache.to_string(),
            "--ssd-cache-max".into(),
            self.ssd_cache_max.to_string(),
            "--ssd-demote-idle".into(),
            self.ssd_demote_idle.to_string(),
            "--ssd-write-behind-ms".into(),
            self.ssd_write_behind_ms.to_string(),
        ];
        if self.ssd_cache_verify {
            v.push("--ssd-cache-verify".into());
        }
        v
    }
}

/// Runs the engine; returns the process exit code.
pub fn engine(args: EngineArgs) -> u8 {
    threads::init(args.threads);
    // A cache file over a file-size limit must be a write error (the cache backs off),
    // not a signal that kills the engine.
    // SAFETY: installing SIG_IGN has no handler code to be unsafe about.
    let _ =
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGXFSZ, nix::sys::signal::SigHandler::SigIgn) };
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
        defaults: args.sampling.defaults(),
        shutdown_timeout: Duration::from_millis(args.shutdown_timeout_ms),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
        cache: args.cache.config(args.ssd_cache.clone()),
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
