//! `corral serve [QUERY]`: the gateway. Models come from `--model` flags (`PATH` or
//! `ID=PATH`), else every `.gguf` in the models directory and every GGUF in the Hugging
//! Face cache (`models.rs`); a query keeps those whose id contains it. Engines start on
//! demand. Settings may also come from a config file (`config.rs`), re-read on SIGHUP
//! (`reload.rs`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use corral_gateway::{ApiKey, Cors, GatewayConfig, StoreConfig, UpstreamSpec};
use corral_net::dirs::{self, Access, SocketState};
use corral_pool::registry::{self, ModelEntry};
use corral_pool::{Pool, PoolConfig};
use corral_protocol::ModelId;
use corral_protocol::launch::EngineOptions;

#[derive(Args)]
pub struct ServeArgs {
    /// Config file (default $XDG_CONFIG_HOME/corral/corral.toml, which may be missing);
    /// command-line flags and environment variables override it. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE", env = "CORRAL_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Serve only the models whose id contains this (case-insensitive), e.g. `smollm`.
    #[arg(value_name = "QUERY")]
    pub(crate) query: Option<String>,
    /// Address to bind. Keep the default unless other machines must reach it.
    #[arg(long, default_value = "127.0.0.1", env = "CORRAL_HOST")]
    host: IpAddr,
    /// Port to bind (0 picks a free one; the chosen address is printed on stdout).
    #[arg(long, default_value_t = 8080, env = "CORRAL_PORT")]
    pub(crate) port: u16,
    /// A model to serve: `PATH` (id = file stem) or `ID=PATH`. Repeatable.
    #[arg(long = "model", value_name = "[ID=]PATH")]
    pub(crate) models: Vec<String>,
    /// A model served by another OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp,
    /// another corral): `ID=URL[,URL…]`, one base URL per replica. Repeatable. Its key,
    /// timeouts and the upstream's own model name go in the config file's
    /// `[models.<id>]` table.
    #[arg(long = "upstream", value_name = "ID=URL[,URL…]", value_parser = UpstreamSpec::parse_flag)]
    pub(crate) upstreams: Vec<UpstreamSpec>,
    /// Serve every .gguf here (and every GGUF in the Hugging Face cache) when no --model
    /// is given.
    #[arg(long, env = "CORRAL_MODELS_DIR")]
    models_dir: Option<PathBuf>,
    /// Engines kept resident at once (least recently used idle ones are evicted).
    #[arg(long, default_value_t = 1, env = "CORRAL_MODEL_POOL")]
    pub(crate) model_pool: usize,
    /// Memory budget in GB (decimal) for resident engines (model files + KV); default
    /// 0.75 × physical memory. Each engine gets an equal share for its KV cache.
    #[arg(long, value_parser = crate::engine_cmd::gigabytes, env = "CORRAL_MEMORY_BUDGET")]
    memory_budget: Option<f64>,
    /// KV budget per engine in GB, passed to engines (default: its share of the memory
    /// budget less its model file).
    #[arg(long, value_parser = crate::engine_cmd::gigabytes, env = "CORRAL_KV_BUDGET")]
    kv_budget: Option<f64>,
    /// Stop an engine idle this long (e.g. 300, 5m, 1h); unset = keep it.
    #[arg(long, env = "CORRAL_KEEP_ALIVE", value_parser = parse_duration)]
    pub(crate) keep_alive: Option<Duration>,
    /// Private directory for engine sockets (default $XDG_RUNTIME_DIR/corral or /tmp/corral-<uid>).
    #[arg(long, env = "CORRAL_RUNTIME_DIR")]
    runtime_dir: Option<PathBuf>,
    /// Start these models' engines at startup (repeatable; `all` for every model).
    #[arg(long)]
    preload: Vec<String>,
    /// Context size per request, passed to engines.
    #[arg(long, alias = "context-length", env = "CORRAL_CTX")]
    ctx: Option<usize>,
    /// Requests waiting per engine before 429, passed to engines.
    #[arg(long)]
    max_queue: Option<usize>,
    /// Requests each engine generates together (default 8; 1 = one at a time), passed
    /// to engines.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256), env = "CORRAL_BATCH")]
    batch: Option<usize>,
    /// Sampling defaults, passed to engines.
    #[command(flatten)]
    sampling: crate::engine_cmd::GenDefaultsArgs,
    /// Compute threads per engine, passed to engines.
    #[arg(long, env = "CORRAL_THREADS")]
    threads: Option<usize>,
    /// Compute device for engines: auto (default: a usable NVIDIA GPU, else the CPU),
    /// cpu, cuda or cuda:N.
    #[arg(long, env = "CORRAL_DEVICE")]
    device: Option<corral_engine::backend::DeviceChoice>,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, default_value_t = 8 * 1024 * 1024, env = "CORRAL_MAX_BODY_BYTES")]
    max_body_bytes: usize,
    /// Client connections served at once; more wait to be accepted.
    #[arg(long, default_value_t = corral_protocol::http_limits::MAX_CONNECTIONS, env = "CORRAL_MAX_CONNECTIONS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_connections: usize,
    /// A client must send its request line and headers within this (a connection idle
    /// between requests is closed after it too).
    #[arg(long, default_value = "10s", value_parser = positive_duration, env = "CORRAL_HEADER_TIMEOUT")]
    header_timeout: Duration,
    /// A request body with no bytes for this long is answered 408.
    #[arg(long, default_value = "30s", value_parser = positive_duration, env = "CORRAL_BODY_TIMEOUT")]
    body_timeout: Duration,
    /// Longest wait for an engine to load.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    load_timeout: Duration,
    /// Longest wait for a free engine slot before 503 overloaded.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    queue_timeout: Duration,
    /// No response head from an engine within this: 504 engine_timeout.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    engine_timeout: Duration,
    /// No bytes from an engine mid-response for this long: the response is cut.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    stall_timeout: Duration,
    /// How long shutdown lets in-flight requests finish.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// SIGTERM → SIGKILL deadline for engines.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    stop_timeout: Duration,
    /// Prompt-cache directory (SSD tier) for every engine (default <user cache dir>/corral/kv).
    #[arg(long, value_name = "DIR", env = "CORRAL_SSD_CACHE")]
    ssd_cache: Option<PathBuf>,
    /// Keep prompt caches in RAM only: an evicted engine's cache is lost.
    #[arg(long, conflicts_with = "ssd_cache")]
    no_ssd_cache: bool,
    #[command(flatten)]
    cache: crate::engine_cmd::CacheArgs,
    /// Where stored Responses (`previous_response_id`) are kept across restarts
    /// (default <user cache dir>/corral/responses).
    #[arg(long, value_name = "DIR", env = "CORRAL_RESPONSES_DIR")]
    responses_dir: Option<PathBuf>,
    /// Stored Responses kept at most (oldest go first).
    #[arg(long, default_value_t = 10_000)]
    responses_max: usize,
    /// Bytes of stored Responses kept at most, in MB (they are held in memory too).
    #[arg(long, default_value_t = 256.0)]
    responses_max_mb: f64,
    /// Stored Responses older than this are dropped (e.g. 30d, 12h).
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    responses_ttl: Duration,
    /// Do not open the chat page in a browser at start (it is opened only when stdin and
    /// stdout are both a terminal, never under a service manager or a pipe).
    #[arg(long, env = "CORRAL_NO_OPEN")]
    pub(crate) no_open: bool,
    /// Also accept requests whose Host header names this host (repeatable; comma-separated
    /// in the env var). Only `localhost`, `127.0.0.1`, `[::1]` and the bound address are
    /// accepted otherwise, with the server's port (a guard against DNS rebinding).
    #[arg(long = "allow-host", env = "CORRAL_ALLOW_HOST", value_delimiter = ',')]
    allow_hosts: Vec<String>,
    /// A web origin (`scheme://host[:port]`, exact) whose pages may call the API from a
    /// browser: its requests get CORS headers and may POST. Repeatable; comma-separated
    /// in the env var. None by default (the web UI needs none).
    #[arg(long = "allow-origin", env = "CORRAL_ALLOW_ORIGIN", value_delimiter = ',')]
    allow_origins: Vec<String>,
    /// Require this key on every route but /health and the web UI's files, as
    /// `Authorization: Bearer KEY` or `x-api-key: KEY`. Needed to listen on a
    /// non-loopback --host.
    #[arg(long, env = "CORRAL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the API key from the first line of this file (keeps it out of `ps`);
    /// --api-key wins when both are given.
    #[arg(long, value_name = "PATH", env = "CORRAL_API_KEY_FILE")]
    api_key_file: Option<PathBuf>,
    /// Listen on a non-loopback --host without an API key: anyone who can reach the
    /// address can use every model.
    #[arg(long, env = "CORRAL_INSECURE_NO_API_KEY")]
    insecure_no_api_key: bool,
    /// Accepted for mlx-bun command lines: every engine is already its own process.
    #[arg(long, hide = true)]
    isolate: bool,
    /// The engine executable (default: this binary). For tests.
    #[arg(long, hide = true, env = "CORRAL_ENGINE_BIN")]
    engine_bin: Option<PathBuf>,
}

/// `90`, `90s`, `500ms`, `5m`, `2h`, `30d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m, h or d)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A duration above zero (a zero timeout would refuse every request).
fn positive_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).and_then(|d| if d.is_zero() { Err("must be more than 0".into()) } else { Ok(d) })
}

/// `--model` flags, then `configured` (the config file's); if none, every model found
/// (none at all is an error unless there are upstream models). The query is the caller's.
pub(crate) fn model_entries(
    args: &ServeArgs,
    configured: Vec<ModelEntry>,
    has_upstreams: bool,
) -> Result<Vec<ModelEntry>> {
    let mut out: Vec<ModelEntry> = Vec::new();
    for m in &args.models {
        let (id, path) = match m.split_once('=') {
            Some((id, path)) if !Path::new(m).exists() => (Some(id), path),
            _ => (None, m.as_str()),
        };
        let mut e = registry::entry(Path::new(path)).with_context(|| format!("--model {m}"))?;
        if let Some(id) = id {
            e.id = ModelId::new(id).with_context(|| format!("--model {m}"))?;
        }
        if out.iter().any(|o| o.id == e.id) {
            bail!("model id {} is given twice", e.id);
        }
        out.push(e);
    }
    for e in configured {
        if out.iter().any(|o| o.id == e.id) {
            bail!("model id {} is given twice (--model and the config file)", e.id);
        }
        out.push(e);
    }
    if out.is_empty() {
        let dir = args.models_dir.clone().unwrap_or_else(registry::default_models_dir);
        out = crate::models::discover(&dir)?.into_iter().map(|k| k.entry).collect();
        if out.is_empty() && !has_upstreams {
            bail!(
                "no models: none in {} or in the Hugging Face cache {}, and no --model or [models] given (corral pull ORG/REPO fetches one)",
                dir.display(),
                crate::models::hf_cache_root().display()
            );
        }
    }
    Ok(out)
}

fn runtime_dir(arg: Option<PathBuf>) -> Result<PathBuf> {
    let dir = arg.unwrap_or_else(|| match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("corral"),
        _ => std::env::temp_dir().join(format!("corral-{}", nix::unistd::geteuid())),
    });
    dirs::ensure_dir(&dir, Access::Private).context("runtime dir (use --runtime-dir)")?;
    // Sockets left by a gateway that died: remove the dead ones; a live one means
    // another corral uses this directory.
    for ent in std::fs::read_dir(&dir)?.flatten() {
        let p = ent.path();
        if p.extension().and_then(|e| e.to_str()) != Some("sock") {
            continue;
        }
        match dirs::probe_socket(&p)? {
            SocketState::Live => bail!(
                "another corral is running with runtime dir {} ({} answers); use --runtime-dir",
                dir.display(),
                p.display()
            ),
            SocketState::Stale => {
                tracing::info!(socket = %p.display(), "removing a stale engine socket");
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
            SocketState::Absent | SocketState::NotSocket => {}
        }
    }
    Ok(dir)
}

/// Started by a person at a terminal (not a service manager, a pipe or a test).
fn interactive() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The memory budget in bytes (0 = none).
fn memory_budget(args: &ServeArgs) -> u64 {
    args.memory_budget.map_or_else(corral_net::host::default_memory_budget, |g| (g * 1e9) as u64)
}

/// What every engine starts with, given the pool's budget and cap (fixed at start).
pub(crate) fn engine_options(args: &ServeArgs, memory_budget: u64, cap: usize) -> EngineOptions {
    let ssd_dir = (!args.no_ssd_cache).then(|| args.ssd_cache.clone().unwrap_or_else(registry::default_kv_dir));
    EngineOptions {
        ctx: args.ctx,
        max_queue: args.max_queue,
        batch: args.batch,
        // 0 = no budget: the pool does not count, engines take their own default.
        memory_budget_gb: (memory_budget > 0).then(|| memory_budget as f64 / 1e9 / cap.max(1) as f64),
        kv_budget_gb: args.kv_budget,
        threads: args.threads,
        device: args.device.map(|d| d.to_string()),
        sampling: args.sampling.to_flags(),
        cache: args.cache.to_flags(ssd_dir),
    }
}

pub fn serve(args: ServeArgs) -> Result<i32> {
    let source = crate::config::Source::from_process(args.config.clone());
    let crate::config::Loaded { args, models, settings, upstreams } = source.load()?;
    if args.isolate {
        tracing::debug!("--isolate: every engine is its own process already");
    }
    let runtime_dir = runtime_dir(args.runtime_dir.clone())?;
    let memory_budget = memory_budget(&args);
    let engine_options = engine_options(&args, memory_budget, args.model_pool);
    let engine_program = match &args.engine_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the corral binary")?,
    };
    let preload = if args.preload.iter().any(|p| p == "all") {
        models.iter().map(|m| m.id.to_string()).collect()
    } else {
        args.preload.clone()
    };
    let pool_cfg = PoolConfig {
        models,
        cap: args.model_pool.max(1),
        memory_budget,
        runtime_dir,
        engine_program,
        engine_options,
        settings,
        load_timeout: args.load_timeout,
        queue_timeout: args.queue_timeout,
        drain_timeout: args.drain_timeout,
        stop_timeout: args.stop_timeout,
        keep_alive: args.keep_alive,
    };
    let gw = GatewayConfig {
        addr: SocketAddr::new(args.host, args.port),
        max_body_bytes: args.max_body_bytes,
        engine_timeout: args.engine_timeout,
        stall_timeout: args.stall_timeout,
        drain_timeout: args.drain_timeout,
        stats_timeout: Duration::from_millis(500),
        preload,
        responses: StoreConfig {
            dir: Some(
                args.responses_dir
                    .clone()
                    .unwrap_or_else(|| registry::user_cache_dir().join("corral").join("responses")),
            ),
            max_count: args.responses_max,
            max_bytes: (args.responses_max_mb.max(0.0) * 1e6) as u64,
            ttl: args.responses_ttl,
        },
        open_ui: !args.no_open && interactive(),
        allow_hosts: args.allow_hosts.clone(),
        cors: Cors::new(&args.allow_origins).map_err(anyhow::Error::msg)?,
        api_key: ApiKey::resolve(args.api_key.as_deref(), args.api_key_file.as_deref())?,
        insecure_no_api_key: args.insecure_no_api_key,
        max_connections: args.max_connections,
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        upstreams: upstreams.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let pool = Pool::new(pool_cfg)?;
        // SIGHUP is caught from here on, before the gateway says it listens (a task
        // that registered on its first poll left a window where SIGHUP's default action,
        // exit, applied). The task ends with the runtime: it holds nothing that needs a
        // clean stop.
        let hangups = corral_net::signals::watch_hangup();
        tokio::spawn(crate::reload::on_sighup(hangups, source, pool.clone(), upstreams));
        corral_gateway::run(gw, pool).await
    })
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("30d").unwrap(), Duration::from_secs(30 * 86400));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
    }
}
