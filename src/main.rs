//! The `corral` binary: one verb per mode. `run` generates once in-process.

mod bench;
mod engine_cmd;
mod fit;
mod ls;
mod models;
mod pull;
mod run;
mod serve;

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
    /// Download a GGUF model from Hugging Face into its shared cache.
    Pull(pull::PullArgs),
    /// List the models found (models directory and Hugging Face cache).
    Ls(ls::LsArgs),
}

fn main() -> ExitCode {
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
/// stderr the pool parses and re-emits.
fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,corral=info,corral_engine=info"));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    if json {
        fmt.json().flatten_event(true).init();
    } else {
        fmt.compact().init();
    }
}
