//! How an engine process is started and how it ends: its command line, built in one
//! place (`EngineLaunch::to_argv`), the flag names the engine's parser uses (`flag::*`),
//! and the exit codes the pool classifies.
//!
//! The pool builds an `EngineLaunch`; `corral engine` parses the argv back with clap (a
//! round-trip test in the binary keeps the two in step); the fault-injecting test engine
//! reads the same flag names. A flag renamed here is renamed everywhere.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::ModelId;

/// EX_CONFIG from sysexits.h: the model or the engine's configuration cannot work (not a
/// GGUF, unsupported architecture, unusable socket directory). The pool does not retry it.
pub const EXIT_CONFIG: i32 = 78;
/// clap's exit code for a command line it cannot parse: a mismatch between this file and
/// the engine's parser, so also a configuration error, never a crash loop.
pub const EXIT_USAGE: i32 = 2;

/// Exit codes that mean "do not retry": configuration, not a crash.
pub fn is_config_exit(code: i32) -> bool {
    code == EXIT_CONFIG || code == EXIT_USAGE
}

/// Long flag names of `corral engine` (without the leading `--`).
pub mod flag {
    pub const MODEL: &str = "model";
    pub const ID: &str = "id";
    pub const SOCKET: &str = "socket";
    pub const CTX: &str = "ctx";
    pub const MAX_QUEUE: &str = "max-queue";
    pub const BATCH: &str = "batch";
    pub const MEMORY_BUDGET: &str = "memory-budget";
    pub const KV_BUDGET: &str = "kv-budget";
    pub const THREADS: &str = "threads";
    pub const DEVICE: &str = "device";
    pub const TEMPERATURE: &str = "temperature";
    pub const TOP_P: &str = "top-p";
    pub const TOP_K: &str = "top-k";
    pub const MIN_P: &str = "min-p";
    pub const MAX_TOKENS: &str = "max-tokens";
    pub const GRAMMAR: &str = "grammar";
    pub const THINKING: &str = "thinking";
    pub const SPECULATE: &str = "speculate";
    pub const CHAT_TEMPLATE: &str = "chat-template";
    pub const PROMPT_CACHE: &str = "prompt-cache";
    pub const SSD_CACHE: &str = "ssd-cache";
    pub const SSD_CACHE_MAX: &str = "ssd-cache-max";
    pub const SSD_CACHE_VERIFY: &str = "ssd-cache-verify";
    pub const SSD_DEMOTE_IDLE: &str = "ssd-demote-idle";
    pub const SSD_SPILL_QUEUE: &str = "ssd-spill-queue";
    pub const SSD_WRITE_BEHIND: &str = "ssd-write-behind";
    pub const SSD_WRITE_BEHIND_MS: &str = "ssd-write-behind-ms";
}

/// Sampling defaults for requests that omit a field.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingFlags {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub max_tokens: Option<usize>,
    /// Constrained decoding; `Some(false)` turns it off (`--grammar off`).
    pub grammar: Option<bool>,
    /// `enable_thinking` for requests that do not say.
    pub thinking: Option<bool>,
    /// Speculative decoding for requests that do not say (`off`, `ngram`).
    pub speculate: Option<String>,
    /// A Jinja chat template replacing the model's.
    pub chat_template: Option<PathBuf>,
}

/// Prompt-cache settings; `None` leaves the engine's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheFlags {
    /// RAM tier, GB (0 turns the prompt cache off).
    pub prompt_cache_gb: Option<f64>,
    /// SSD tier directory (none: no SSD tier).
    pub ssd_cache: Option<PathBuf>,
    pub ssd_cache_max_gb: Option<f64>,
    pub ssd_cache_verify: bool,
    /// Seconds unused before an entry leaves RAM for disk; 0 turns idle demotion off.
    pub ssd_demote_idle_s: Option<u64>,
    /// Bytes of evicted entries waiting for the disk writer, GB.
    pub ssd_spill_queue_gb: Option<f64>,
    /// Write new entries behind once the engine is idle (eviction and drain always write).
    pub ssd_write_behind: Option<bool>,
    pub ssd_write_behind_ms: Option<u64>,
}

/// Tokens per request when `--ctx` is not given (never more than the model's training
/// context).
pub const DEFAULT_CTX: usize = 4096;

/// The context an engine serves: `--ctx` or the default, within the model's training
/// context, at least 16.
pub fn effective_ctx(flag: Option<usize>, ctx_train: usize) -> usize {
    flag.unwrap_or(DEFAULT_CTX).min(ctx_train).max(16)
}

/// Everything but the model and socket: the same for every engine of a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineOptions {
    pub ctx: Option<usize>,
    pub max_queue: Option<usize>,
    pub batch: Option<usize>,
    /// This engine's memory budget in GB (decimal).
    pub memory_budget_gb: Option<f64>,
    pub kv_budget_gb: Option<f64>,
    pub threads: Option<usize>,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: Option<String>,
    pub sampling: SamplingFlags,
    pub cache: CacheFlags,
}

/// One engine process to start.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineLaunch {
    pub model: PathBuf,
    pub id: ModelId,
    pub socket: PathBuf,
    pub options: EngineOptions,
}

impl EngineLaunch {
    /// The arguments after the program name: `engine --model … --id … --socket …` and
    /// every option that is set.
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut a = Argv(vec!["engine".into()]);
        a.value(flag::MODEL, self.model.clone());
        a.value(flag::ID, self.id.as_str());
        a.value(flag::SOCKET, self.socket.clone());
        let o = &self.options;
        a.opt(flag::CTX, o.ctx);
        a.opt(flag::MAX_QUEUE, o.max_queue);
        a.opt(flag::BATCH, o.batch);
        a.opt(flag::MEMORY_BUDGET, o.memory_budget_gb);
        a.opt(flag::KV_BUDGET, o.kv_budget_gb);
        a.opt(flag::THREADS, o.threads);
        a.opt(flag::DEVICE, o.device.as_deref());
        let s = &o.sampling;
        a.opt(flag::TEMPERATURE, s.temperature);
        a.opt(flag::TOP_P, s.top_p);
        a.opt(flag::TOP_K, s.top_k);
        a.opt(flag::MIN_P, s.min_p);
        a.opt(flag::MAX_TOKENS, s.max_tokens);
        a.opt(flag::GRAMMAR, s.grammar.map(|on| if on { "on" } else { "off" }));
        a.opt(flag::THINKING, s.thinking);
        a.opt(flag::SPECULATE, s.speculate.as_deref());
        if let Some(t) = &s.chat_template {
            a.value(flag::CHAT_TEMPLATE, t.clone());
        }
        let c = &o.cache;
        a.opt(flag::PROMPT_CACHE, c.prompt_cache_gb);
        if let Some(dir) = &c.ssd_cache {
            a.value(flag::SSD_CACHE, dir.clone());
        }
        a.opt(flag::SSD_CACHE_MAX, c.ssd_cache_max_gb);
        if c.ssd_cache_verify {
            a.0.push(format!("--{}", flag::SSD_CACHE_VERIFY).into());
        }
        a.opt(flag::SSD_DEMOTE_IDLE, c.ssd_demote_idle_s);
        a.opt(flag::SSD_SPILL_QUEUE, c.ssd_spill_queue_gb);
        a.opt(flag::SSD_WRITE_BEHIND, c.ssd_write_behind);
        a.opt(flag::SSD_WRITE_BEHIND_MS, c.ssd_write_behind_ms);
        a.0
    }
}

struct Argv(Vec<OsString>);

impl Argv {
    fn value(&mut self, name: &str, v: impl Into<OsString>) {
        self.0.push(format!("--{name}").into());
        self.0.push(v.into());
    }

    fn opt<T: ToString>(&mut self, name: &str, v: Option<T>) {
        if let Some(v) = v {
            self.value(name, v.to_string());
        }
    }
}

/// The value following `--name` in an argv (for the test engine, which has no clap).
pub fn find_arg(args: &[String], name: &str) -> Option<String> {
    let long = format!("--{name}");
    args.iter().position(|a| *a == long).and_then(|i| args.get(i + 1).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_has_the_required_flags_first_and_only_set_options() {
        let launch = EngineLaunch {
            model: "/m/a.gguf".into(),
            id: ModelId::new("a").unwrap(),
            socket: "/run/e.sock".into(),
            options: EngineOptions {
                ctx: Some(2048),
                cache: CacheFlags { ssd_cache_verify: true, ssd_write_behind: Some(false), ..Default::default() },
                ..Default::default()
            },
        };
        let argv: Vec<String> = launch.to_argv().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert_eq!(
            argv,
            [
                "engine",
                "--model",
                "/m/a.gguf",
                "--id",
                "a",
                "--socket",
                "/run/e.sock",
                "--ctx",
                "2048",
                "--ssd-cache-verify",
                "--ssd-write-behind",
                "false"
            ]
        );
        assert_eq!(find_arg(&argv, flag::SOCKET).as_deref(), Some("/run/e.sock"));
        assert_eq!(find_arg(&argv, flag::THREADS), None);
    }

    #[test]
    fn config_exits() {
        assert!(is_config_exit(78) && is_config_exit(2));
        assert!(!is_config_exit(0) && !is_config_exit(1) && !is_config_exit(134));
    }
}
