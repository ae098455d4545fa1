//! `corral engine`: the child process the pool starts, one per model. Not usually run
//! by hand (it exits when its stdin closes). Its command line is built by
//! `protocol::launch::EngineLaunch::to_argv` and its flag names come from there (a test
//! below parses one back). Exit codes: 0 clean stop, 78 configuration error (model
//! cannot be loaded, socket directory unusable), 2 a command line clap rejects, 1
//! anything else.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;
use corral_engine::backend::DeviceChoice;
use corral_engine::cache::{CacheConfig, SsdConfig};
use corral_engine::server::{ServeError, ServerConfig, ServerDefaults};
use corral_engine::speculate::Speculate;
use corral_engine::{Engine, threads};
use corral_protocol::ModelId;
use corral_protocol::launch::{CacheFlags, EXIT_CONFIG, SamplingFlags, flag};

#[derive(Args)]
pub struct EngineArgs {
    /// Model file (GGUF).
    #[arg(long = flag::MODEL)]
    model: PathBuf,
    /// Model id to serve under (default: the file stem).
    #[arg(long = flag::ID)]
    id: Option<String>,
    /// Unix socket to listen on; its directory must be private (0700) or absent.
    #[arg(long = flag::SOCKET)]
    socket: PathBuf,
    /// Context size per request (prompt + generation); default min(4096, the model's).
    #[arg(long = flag::CTX, alias = "context-length", env = "CORRAL_CTX")]
    ctx: Option<usize>,
    /// Requests allowed to wait behind the running one before 429 queue_full.
    #[arg(long = flag::MAX_QUEUE, default_value_t = 64, env = "CORRAL_MAX_QUEUE")]
    max_queue: usize,
    /// Requests generated together, one forward pass for all of them (1 = one at a
    /// time). A greedy request's tokens do not depend on it.
    #[arg(long = flag::BATCH, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256), env = "CORRAL_BATCH")]
    batch: usize,
    /// Memory this engine may use, in GB (decimal); default 0.75 × physical memory.
    #[arg(long = flag::MEMORY_BUDGET, value_parser = gigabytes, env = "CORRAL_MEMORY_BUDGET")]
    memory_budget: Option<f64>,
    /// What the running requests' KV cache may add up to, in GB; default the memory
    /// budget less the model file. Requests that do not fit wait; one that never can is
    /// refused (400 context_over_budget).
    #[arg(long = flag::KV_BUDGET, value_parser = gigabytes, env = "CORRAL_KV_BUDGET")]
    kv_budget: Option<f64>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024, env = "CORRAL_MAX_BODY_BYTES")]
    max_body_bytes: usize,
    #[command(flatten)]
    sampling: GenDefaultsArgs,
    /// Milliseconds SIGTERM waits for in-flight requests before cutting them.
    #[arg(long, default_value_t = 10_000, env = "CORRAL_ENGINE_SHUTDOWN_TIMEOUT_MS")]
    shutdown_timeout_ms: u64,
    /// Default deadline of POST /admin/drain, in milliseconds.
    #[arg(long, default_value_t = 30_000, env = "CORRAL_ENGINE_DRAIN_TIMEOUT_MS")]
    drain_timeout_ms: u64,
    /// Compute threads (default: physical cores).
    #[arg(long = flag::THREADS, env = "CORRAL_THREADS")]
    threads: Option<usize>,
    /// Compute device: auto (a usable NVIDIA GPU, else the CPU), cpu, cuda or cuda:N.
    #[arg(long = flag::DEVICE, default_value = "auto", env = "CORRAL_DEVICE")]
    device: DeviceChoice,
    /// Keep prompt-cache entries on disk in this directory (SSD tier; off by default
    /// for a bare engine, on by default under `corral serve`).
    #[arg(long = flag::SSD_CACHE, value_name = "DIR", env = "CORRAL_SSD_CACHE")]
    ssd_cache: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

/// Sampling defaults for requests that omit a field (shared by `engine` and `serve`,
/// which passes them on).
#[derive(Args, Clone, Debug)]
pub struct GenDefaultsArgs {
    /// Default temperature for requests that omit it (0-5).
    #[arg(long = flag::TEMPERATURE, alias = "temp", value_parser = in_range(0.0, 5.0))]
    pub temperature: Option<f32>,
    /// Default top-p for requests that omit it (0-1).
    #[arg(long = flag::TOP_P, value_parser = in_range(0.0, 1.0))]
    pub top_p: Option<f32>,
    /// Default top-k for requests that omit it (0-1000000; 0 = off).
    #[arg(long = flag::TOP_K, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub top_k: Option<u32>,
    /// Default min-p for requests that omit it (0-1).
    #[arg(long = flag::MIN_P, value_parser = in_range(0.0, 1.0))]
    pub min_p: Option<f32>,
    /// Default max_tokens for requests that omit it (unset: chat until the context is
    /// full, raw completions 512).
    #[arg(long = flag::MAX_TOKENS)]
    pub max_tokens: Option<usize>,
    /// Constrained decoding (structured output, tool calls): `off` states constraints
    /// in the prompt instead and marks responses with a Warning header.
    /// Ask templates that can reason to think (`enable_thinking`) when a request does
    /// not say; unset: the template's own default.
    #[arg(long = flag::THINKING, value_name = "BOOL", env = "CORRAL_THINKING", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub thinking: Option<bool>,
    /// Use this Jinja chat template instead of the model's own (for GGUFs with a
    /// broken or missing one).
    #[arg(long = flag::CHAT_TEMPLATE, value_name = "FILE", env = "CORRAL_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    #[arg(long = flag::GRAMMAR, value_name = "on|off", default_value = "on", env = "CORRAL_GRAMMAR", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub grammar: bool,
    /// Speculative decoding for requests that do not say (their `speculate` field):
    /// `ngram` drafts tokens from the request's own prompt and output and verifies them
    /// several a pass — the same tokens, fewer passes (docs/speculation.md).
    #[arg(long = flag::SPECULATE, value_name = "off|ngram", default_value = "off", env = "CORRAL_SPECULATE")]
    pub speculate: Speculate,
}

/// A float flag bounded to `[lo, hi]`; the error names the range.
/// A size in GB (decimal), at least 0.
pub(crate) fn gigabytes(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(g) if g.is_finite() && g >= 0.0 => Ok(g),
        _ => Err(format!("{s:?} is not a size in GB (a number, at least 0)")),
    }
}

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

impl GenDefaultsArgs {
    fn defaults(&self) -> ServerDefaults {
        ServerDefaults {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(|k| k as usize),
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            grammar_off: !self.grammar,
            thinking: self.thinking,
            speculate: self.speculate,
        }
    }

    /// The same defaults for the engines `serve` starts.
    pub fn to_flags(&self) -> SamplingFlags {
        SamplingFlags {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(|k| k as usize),
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            grammar: (!self.grammar).then_some(false),
            thinking: self.thinking,
            speculate: (self.speculate != Speculate::Off).then(|| self.speculate.as_str().to_owned()),
            // Engines may not share the gateway's working directory.
            chat_template: self.chat_template.as_ref().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())),
        }
    }
}

/// Prompt-cache flags (shared by `engine` and `serve`, which passes them on).
#[derive(Args, Clone, Debug)]
pub struct CacheArgs {
    /// RAM for the prompt cache, in GB (0 turns the prompt cache off).
    #[arg(long = flag::PROMPT_CACHE, value_name = "GB", default_value_t = 8.0, env = "CORRAL_PROMPT_CACHE")]
    pub prompt_cache: f64,
    /// SSD cap, in GB.
    #[arg(long = flag::SSD_CACHE_MAX, value_name = "GB", default_value_t = 32.0, env = "CORRAL_SSD_CACHE_MAX")]
    pub ssd_cache_max: f64,
    /// Check every tensor checksum on every restore (default: once per file per process).
    #[arg(long = flag::SSD_CACHE_VERIFY, env = "CORRAL_SSD_CACHE_VERIFY")]
    pub ssd_cache_verify: bool,
    /// Entries unused this many seconds leave RAM for the SSD tier; 0 turns idle
    /// demotion off (entries then leave RAM only when the RAM cap or a drain needs it).
    #[arg(
        long = flag::SSD_DEMOTE_IDLE,
        alias = "ssd-cache-demote-idle",
        value_name = "SEC",
        default_value_t = 300,
        env = "CORRAL_SSD_DEMOTE_IDLE"
    )]
    pub ssd_demote_idle: u64,
    /// Bytes of entries pushed out of RAM that may wait for the disk writer, in GB; over
    /// it the oldest waiting entry is dropped (a later miss, never a wrong answer).
    #[arg(long = flag::SSD_SPILL_QUEUE, value_name = "GB", default_value_t = 2.0, env = "CORRAL_SSD_SPILL_QUEUE")]
    pub ssd_spill_queue: f64,
    /// Write new entries to disk shortly after each request (so a crashed engine's
    /// work survives); `0`/`false` turns it off while eviction and drain still write.
    #[arg(
        long = flag::SSD_WRITE_BEHIND,
        value_name = "BOOL",
        default_value = "true",
        value_parser = BoolishValueParser::new(),
        action = clap::ArgAction::Set,
        env = "CORRAL_SSD_WRITEBEHIND"
    )]
    pub ssd_write_behind: bool,
    /// Idle milliseconds after a request before new entries are written behind.
    #[arg(long = flag::SSD_WRITE_BEHIND_MS, value_name = "MS", default_value_t = 2000, hide = true)]
    pub ssd_write_behind_ms: u64,
}

fn gb(x: f64) -> u64 {
    (x.max(0.0) * 1e9) as u64
}

impl CacheArgs {
    pub fn config(&self, ssd_dir: Option<PathBuf>) -> CacheConfig {
        CacheConfig {
            ram_bytes: gb(self.prompt_cache),
            ssd: ssd_dir.map(|dir| SsdConfig { dir, max_bytes: gb(self.ssd_cache_max), verify: self.ssd_cache_verify }),
            demote_idle: (self.ssd_demote_idle > 0).then(|| Duration::from_secs(self.ssd_demote_idle)),
            spill_queue_bytes: gb(self.ssd_spill_queue),
            write_behind: self.ssd_write_behind,
            write_behind_after: Duration::from_millis(self.ssd_write_behind_ms),
        }
    }

    /// The same settings for the engines `serve` starts.
    pub fn to_flags(&self, ssd_cache: Option<PathBuf>) -> CacheFlags {
        CacheFlags {
            prompt_cache_gb: Some(self.prompt_cache),
            ssd_cache,
            ssd_cache_max_gb: Some(self.ssd_cache_max),
            ssd_cache_verify: self.ssd_cache_verify,
            ssd_demote_idle_s: Some(self.ssd_demote_idle),
            ssd_spill_queue_gb: Some(self.ssd_spill_queue),
            ssd_write_behind: Some(self.ssd_write_behind),
            ssd_write_behind_ms: Some(self.ssd_write_behind_ms),
        }
    }
}

/// `EXIT_CONFIG` as a process exit code.
const CONFIG: u8 = EXIT_CONFIG as u8;

/// Runs the engine; returns the process exit code.
pub fn engine(args: EngineArgs) -> u8 {
    threads::init(args.threads);
    // A cache file over a file-size limit must be a write error (the cache backs off),
    // not a signal that kills the engine.
    // SAFETY: installing SIG_IGN has no handler code to be unsafe about.
    let _ =
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGXFSZ, nix::sys::signal::SigHandler::SigIgn) };
    let stem = args.model.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_owned();
    let id = match ModelId::new(args.id.clone().unwrap_or(stem)) {
        Ok(id) => id,
        Err(e) => return fail(CONFIG, &format!("bad model id: {e}")),
    };
    let mut engine = match Engine::load_with(&args.model, args.ssd_cache.as_deref(), args.device) {
        Ok(e) => e,
        Err(e) => return fail(CONFIG, &e.to_string()),
    };
    if let Some(path) = &args.sampling.chat_template {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return fail(CONFIG, &format!("--chat-template {}: {e}", path.display())),
        };
        if let Err(e) = engine.set_chat_template(&text) {
            return fail(CONFIG, &format!("--chat-template {}: {e}", path.display()));
        }
    }
    let load_ms = engine.load_time.as_millis() as u64;
    let ctx = corral_protocol::launch::effective_ctx(args.ctx, engine.config().ctx_train);
    engine.set_context(ctx);
    let cfg = ServerConfig {
        socket: args.socket,
        model_id: id.to_string(),
        ctx,
        max_queue: args.max_queue,
        batch: args.batch,
        memory_budget: args.memory_budget.map_or_else(corral_net::host::default_memory_budget, |g| (g * 1e9) as u64),
        kv_budget: args.kv_budget.map(|g| (g * 1e9) as u64),
        max_body_bytes: args.max_body_bytes,
        defaults: args.sampling.defaults(),
        shutdown_timeout: Duration::from_millis(args.shutdown_timeout_ms),
        drain_timeout: Duration::from_millis(args.drain_timeout_ms),
        cache: args.cache.config(args.ssd_cache.clone()),
    };
    match corral_engine::server::run(engine, cfg, load_ms) {
        Ok(()) => 0,
        Err(ServeError::Socket(e)) => fail(CONFIG, &e.to_string()),
        Err(e) => fail(1, &e.to_string()),
    }
}

fn fail(code: u8, msg: &str) -> u8 {
    tracing::error!(error = msg, "engine failed");
    eprintln!("corral engine: error: {msg}");
    code
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use corral_protocol::launch::{EngineLaunch, EngineOptions};

    use super::*;

    /// The argv the pool builds is the argv this parser accepts, value for value.
    #[test]
    fn the_pools_command_line_parses_back() {
        let launch = EngineLaunch {
            model: "/models/m.gguf".into(),
            id: ModelId::new("m").unwrap(),
            socket: "/run/corral/e-1.sock".into(),
            options: EngineOptions {
                ctx: Some(2048),
                max_queue: Some(7),
                batch: Some(4),
                memory_budget_gb: Some(2.5),
                kv_budget_gb: Some(0.25),
                threads: Some(3),
                device: Some("cuda:1".into()),
                sampling: SamplingFlags {
                    temperature: Some(0.5),
                    top_p: Some(0.9),
                    top_k: Some(40),
                    min_p: Some(0.05),
                    max_tokens: Some(100),
                    grammar: Some(false),
                    thinking: Some(true),
                    speculate: Some("ngram".into()),
                    chat_template: Some("/t/chat.jinja".into()),
                },
                cache: CacheFlags {
                    prompt_cache_gb: Some(1.5),
                    ssd_cache: Some("/kv".into()),
                    ssd_cache_max_gb: Some(4.0),
                    ssd_cache_verify: true,
                    ssd_demote_idle_s: Some(0),
                    ssd_spill_queue_gb: Some(0.5),
                    ssd_write_behind: Some(false),
                    ssd_write_behind_ms: Some(250),
                },
            },
        };
        let argv = std::iter::once("corral".into()).chain(launch.to_argv());
        let crate::Command::Engine(a) = crate::Cli::try_parse_from(argv).unwrap().command else {
            panic!("not the engine verb")
        };
        assert_eq!(
            (a.model.to_str(), a.id.as_deref(), a.socket.to_str()),
            (Some("/models/m.gguf"), Some("m"), Some("/run/corral/e-1.sock"))
        );
        assert_eq!((a.ctx, a.max_queue, a.batch, a.threads), (Some(2048), 7, 4, Some(3)));
        assert_eq!(a.device, DeviceChoice::Cuda(1));
        assert_eq!((a.memory_budget, a.kv_budget), (Some(2.5), Some(0.25)));
        assert_eq!(a.sampling.to_flags(), launch.options.sampling);
        assert_eq!(a.cache.to_flags(a.ssd_cache.clone()), launch.options.cache);
        let cfg = a.cache.config(a.ssd_cache.clone());
        assert_eq!(cfg.demote_idle, None, "0 turns idle demotion off");
        assert!(!cfg.write_behind);
        assert_eq!(cfg.spill_queue_bytes, 500_000_000);
    }

    #[test]
    fn write_behind_takes_boolish_values_and_the_demote_alias() {
        let parse = |extra: &[&str]| {
            let argv = ["corral", "engine", "--model", "m", "--socket", "s"].iter().chain(extra).copied();
            match crate::Cli::try_parse_from(argv).unwrap().command {
                crate::Command::Engine(a) => a,
                _ => unreachable!(),
            }
        };
        assert!(parse(&[]).cache.ssd_write_behind, "on by default");
        assert!(!parse(&["--ssd-write-behind", "0"]).cache.ssd_write_behind);
        assert_eq!(parse(&["--ssd-cache-demote-idle", "9"]).cache.ssd_demote_idle, 9);
    }
}
