//! `corral fit MODEL`: will this model fit, and how fast can it decode? Reads the GGUF
//! header and tensor table only (no weights are loaded), then prints the weight bytes,
//! the KV bytes per token, the largest context that fits the memory budget, and a decode
//! rate estimate from this machine's measured memory bandwidth (decode reads every
//! weight once per token, so bandwidth ÷ weight bytes bounds it).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use corral_engine::config::ModelConfig;
use corral_engine::gguf::Gguf;
use corral_engine::kv::KvShape;
use serde_json::json;

#[derive(Args)]
pub struct FitArgs {
    /// The GGUF file.
    model: PathBuf,
    /// Memory budget in GB (decimal); default 0.75 × physical memory.
    #[arg(long, value_parser = crate::engine_cmd::gigabytes)]
    memory_budget: Option<f64>,
    /// Threads for the bandwidth measurement (default: all available).
    #[arg(long)]
    threads: Option<usize>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The numbers, from plain values.
#[derive(Debug, PartialEq)]
pub struct Fit {
    pub weight_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// Positions the budget holds after the weights (whole KV, one sequence).
    pub max_context: u64,
    pub ctx_train: u64,
    pub decode_tok_s_bound: f64,
}

pub fn fit(weight_bytes: u64, kv_bytes_per_token: u64, budget: u64, ctx_train: u64, bandwidth: f64) -> Fit {
    let max_context = budget.saturating_sub(weight_bytes) / kv_bytes_per_token.max(1);
    Fit {
        weight_bytes,
        kv_bytes_per_token,
        max_context,
        ctx_train,
        decode_tok_s_bound: if weight_bytes == 0 { 0.0 } else { bandwidth / weight_bytes as f64 },
    }
}

pub fn run(args: FitArgs) -> Result<()> {
    let g = Gguf::open(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let cfg = ModelConfig::from_gguf(&g)?;
    let shape = KvShape { n_layers: cfg.n_layers, kv_dim: cfg.kv_dim() };
    let budget = args.memory_budget.map_or_else(corral_net::host::default_memory_budget, |gb| (gb * 1e9) as u64);
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bandwidth = corral_engine::threads::read_bandwidth(threads);
    let f = fit(g.file_len(), shape.bytes_per_token() as u64, budget, cfg.ctx_train as u64, bandwidth);
    if args.json {
        println!(
            "{}",
            json!({"model": args.model, "arch": cfg.arch.name(), "weight_bytes": f.weight_bytes,
                   "kv_bytes_per_token": f.kv_bytes_per_token, "memory_budget_bytes": budget,
                   "max_context_in_budget": f.max_context, "ctx_train": f.ctx_train,
                   "read_bandwidth_bytes_s": bandwidth, "threads": threads,
                   "decode_tok_s_bound": f.decode_tok_s_bound})
        );
        return Ok(());
    }
    let gb = |b: f64| b / 1e9;
    println!("model            {} ({})", args.model.display(), cfg.arch.name());
    println!("weights          {:.3} GB", gb(f.weight_bytes as f64));
    println!(
        "KV per token     {} bytes ({} layers x {} K+V floats, f16)",
        f.kv_bytes_per_token,
        cfg.n_layers,
        2 * cfg.kv_dim()
    );
    println!("memory budget    {:.2} GB", gb(budget as f64));
    println!(
        "largest context  {} tokens in the budget (the model was trained for {}){}",
        f.max_context,
        f.ctx_train,
        if f.max_context < 16 { " — the weights alone do not fit" } else { "" }
    );
    println!("read bandwidth   {:.1} GB/s ({threads} threads, measured now)", gb(bandwidth));
    println!(
        "decode bound     {:.0} tok/s (bandwidth / weight bytes; real decode reaches a fraction)",
        f.decode_tok_s_bound
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn the_budget_left_after_the_weights_is_context() {
        let f = fit(1_000, 10, 11_000, 8192, 5_000.0);
        assert_eq!((f.max_context, f.decode_tok_s_bound), (1_000, 5.0));
        assert_eq!(fit(2_000, 10, 1_000, 8192, 1.0).max_context, 0, "weights over the budget");
    }
}
