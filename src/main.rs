//! The `corral` binary: one verb per mode. `run` generates once in-process.

mod bench;
mod client;
mod config;
mod config_file;
mod config_upstream;
mod controls;
mod engine_cmd;
mod fit;
mod human;
mod ls;
mod models;
mod ps;
mod pull;
mod reload;
mod run;
mod serve;
mod service;
mod stats;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "corral",
    version,
    about = "A local LLM server: crash-isolated engines, one per model, behind one gateway."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate once from a prompt, streaming text to stdout and timings to stderr.
    Run(run::RunArgs),
    /// Measure prefill and decode throughput (JSON lines on stdout).
    Bench(bench::BenchArgs),
    /// Serve one model on a unix socket (the child process the gateway starts).
    Engine(engine_cmd::EngineArgs),
    /// Run the gateway: the HTTP API on a TCP port, one engine process per model.
    Serve(Box<serve::ServeArgs>),
    /// Will a model fit the memory budget, and how fast can it decode here?
    Fit(fit::FitArgs),
    /// List the engines a running gateway holds: model, state, pid, memory, uptime.
    Ps(ps::PsArgs),
    /// Show a running gateway's counters and each engine's (`--json`: as sent).
    Stats(stats::StatsArgs),
    /// Start a model's engine on a running gateway and wait until it is ready.
    Load(controls::ControlArgs),
    /// Stop a model's engine on a running gateway (drained, its prompt cache saved).
    Stop(controls::ControlArgs),
    /// Run `corral serve` as a login service (systemd user unit, macOS LaunchAgent).
    Service(service::ServiceArgs),
    /// Download a GGUF model from Hugging Face into its shared cache.
    Pull(pull::PullArgs),
    /// List the models found (models directory and Hugging Face cache).
    Ls(ls::LsArgs),
}

fn main() -> ExitCode {
    // A panic ends the process, in every verb: an engine's supervisor sees a crash, not
    // a zombie engine, and no half-done state outlives it. (The release profile unwinds
    // so tests share its builds; this hook makes the binary abort as `panic = "abort"`
    // would.)
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    let cli = Cli::parse();
    if let Command::Engine(args) = cli.command {
        init_logging(true);
        return ExitCode::from(engine_cmd::engine(args));
    }
    init_logging(false);
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::bench(args),
        Command::Fit(args) => fit::run(args),
        Command::Ps(args) => ps::ps(args),
        Command::Stats(args) => stats::stats(args),
        Command::Load(args) => controls::load(args),
        Command::Stop(args) => controls::stop(args),
        Command::Service(args) => service::service(args),
        Command::Pull(args) => pull::pull(args),
        Command::Ls(args) => ls::ls(args),
        Command::Serve(args) => match serve::serve(*args) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code.clamp(1, 255) as u8),
            Err(e) => Err(e),
        },
        Command::Engine(_) => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corral: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Human-readable logs for interactive verbs; JSON lines for child processes, whose
/// stderr the pool parses and re-emits. Under a service (`CORRAL_LOG_FORMAT=json`, set
/// by the files `corral service install` writes) JSON lines too, and into a size-bounded
/// file when `CORRAL_LOG_FILE` names one (launchd does not rotate).
fn init_logging(child: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,corral=info,corral_engine=info"));
    let json = child || std::env::var("CORRAL_LOG_FORMAT").is_ok_and(|f| f == "json");
    let file = std::env::var_os("CORRAL_LOG_FILE").filter(|f| !f.is_empty() && !child).and_then(|f| {
        service::logfile::LogFile::open(std::path::Path::new(&f), service::logfile::MAX_BYTES, service::logfile::KEEP)
            .map_err(|e| eprintln!("corral: cannot open log file {}: {e}; logging to stderr", f.to_string_lossy()))
            .ok()
    });
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    match (file, json) {
        (Some(f), true) => fmt.with_writer(f).json().flatten_event(true).init(),
        (Some(f), false) => fmt.with_writer(f).with_ansi(false).compact().init(),
        (None, true) => fmt.with_writer(std::io::stderr).json().flatten_event(true).init(),
        (None, false) => fmt.with_writer(std::io::stderr).compact().init(),
    }
}
