//! The `corral` binary: one verb per mode. `run` generates once in-process.

mod bench;
mod run;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corral: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,corral=info,corral_engine=info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .compact()
        .init();
}
