//! `corral fit MODEL`: will this model fit, and how fast can it decode? Reads the GGUF
//! header and tensor table only (no weights are loaded), then prints the weight bytes,
//! the KV bytes per token (and a hybrid model's recurrent state per sequence, held again
//! at each of its checkpoints), the largest context that fits the memory budget as the
//! engine's admission counts it (`scheduler::admission`), and a decode
//! rate estimate from this machine's measured memory bandwidth (decode reads every
//! weight once per token, so bandwidth ÷ weight bytes bounds it). A mixture of experts
//! reads only the experts a token is routed to: its bound divides by the active bytes
//! (everything but the expert stacks, plus `used / experts` of them), while memory holds
//! all of them (the CPU engine reads an expert on first use, and over a session every
//! expert is used; the GPU uploads them all).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use corral_engine::config::ModelConfig;
use corral_engine::gguf::Gguf;
use corral_engine::kv::KvShape;
use corral_engine::scheduler::admission::KvBudget;
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
    /// Weight bytes one decoded token reads (`weight_bytes` for a dense model).
    pub active_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// A hybrid model's recurrent state, bytes per sequence (0 for other models).
    pub state_bytes: u64,
    /// Positions the budget holds after the weights: one sequence's whole KV in whole
    /// blocks, with its recurrent state and checkpoints (as admission reserves them).
    pub max_context: u64,
    pub ctx_train: u64,
    pub decode_tok_s_bound: f64,
}

/// Bytes of the expert stacks and the share of them a token reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Experts {
    pub bytes: u64,
    pub used: usize,
    pub count: usize,
}

pub fn fit(
    weight_bytes: u64,
    experts: Option<Experts>,
    kv_bytes_per_token: u64,
    state_bytes: u64,
    budget: u64,
    ctx_train: u64,
    bandwidth: f64,
) -> Fit {
    let kv = KvBudget { bytes: budget.saturating_sub(weight_bytes), per_token: kv_bytes_per_token, state_bytes };
    let max_context = kv.max_tokens() as u64;
    let active_bytes = match experts {
        Some(e) => weight_bytes - e.bytes + e.bytes * e.used as u64 / e.count.max(1) as u64,
        None => weight_bytes,
    };
    Fit {
        weight_bytes,
        active_bytes,
        kv_bytes_per_token,
        state_bytes,
        max_context,
        ctx_train,
        decode_tok_s_bound: if active_bytes == 0 { 0.0 } else { bandwidth / active_bytes as f64 },
    }
}

/// The expert stacks' bytes (`blk.N.ffn_*_exps.weight` and their biases).
fn expert_bytes(g: &Gguf) -> u64 {
    g.tensor_names()
        .filter(|n| n.contains("_exps."))
        .filter_map(|n| g.raw_stored(n).ok())
        .map(|(b, _)| b.len() as u64)
        .sum()
}

pub fn run(args: FitArgs) -> Result<()> {
    let g = Gguf::open(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let cfg = ModelConfig::from_gguf(&g)?;
    let shape = KvShape { n_layers: cfg.kv_layers(), kv_dim: cfg.kv_dim() };
    let recurrent = cfg.recurrent_shape();
    let state_bytes = recurrent.map_or(0, |r| r.bytes() as u64);
    let budget = args.memory_budget.map_or_else(corral_net::host::default_memory_budget, |gb| (gb * 1e9) as u64);
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bandwidth = corral_engine::threads::read_bandwidth(threads);
    let experts = cfg.moe.map(|m| Experts { bytes: expert_bytes(&g), used: m.used, count: m.experts });
    let (kv, ctx) = (shape.bytes_per_token() as u64, cfg.ctx_train as u64);
    let f = fit(g.file_len(), experts, kv, state_bytes, budget, ctx, bandwidth);
    if args.json {
        println!(
            "{}",
            json!({"model": args.model, "arch": cfg.arch.name(), "weight_bytes": f.weight_bytes,
                   "active_bytes_per_token": f.active_bytes,
                   "kv_bytes_per_token": f.kv_bytes_per_token, "recurrent_state_bytes": f.state_bytes,
                   "memory_budget_bytes": budget,
                   "max_context_in_budget": f.max_context, "ctx_train": f.ctx_train,
                   "read_bandwidth_bytes_s": bandwidth, "threads": threads,
                   "decode_tok_s_bound": f.decode_tok_s_bound})
        );
        return Ok(());
    }
    let gb = |b: f64| b / 1e9;
    println!("model            {} ({})", args.model.display(), cfg.arch.name());
    println!("weights          {:.3} GB", gb(f.weight_bytes as f64));
    if let (Some(e), Some(m)) = (experts, cfg.moe) {
        println!(
            "experts          {:.3} GB in {} per layer, {} used per token: {:.3} GB read per token",
            gb(e.bytes as f64),
            m.experts,
            m.used,
            gb(f.active_bytes as f64)
        );
    }
    println!(
        "KV per token     {} bytes ({} layers x {} K+V floats, f16)",
        f.kv_bytes_per_token,
        cfg.kv_layers(),
        2 * cfg.kv_dim()
    );
    if let Some(r) = recurrent {
        println!(
            "recurrent state  {} bytes a sequence ({} recurrent layers x {} f32), again per checkpoint (every {} \
             tokens of a prompt, and near its end)",
            f.state_bytes,
            r.layers,
            r.conv + r.ssm,
            corral_engine::checkpoint::EVERY
        );
    }
    println!("memory budget    {:.2} GB", gb(budget as f64));
    println!(
        "largest context  {} tokens in the budget (the model was trained for {}){}",
        f.max_context,
        f.ctx_train,
        if f.max_context < 16 { " — the weights alone do not fit" } else { "" }
    );
    println!("read bandwidth   {:.1} GB/s ({threads} threads, measured now)", gb(bandwidth));
    println!(
        "decode bound     {:.0} tok/s (bandwidth / bytes read per token; real decode reaches a fraction)",
        f.decode_tok_s_bound
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Experts, fit};

    #[test]
    fn the_budget_left_after_the_weights_is_context() {
        // 10,000 bytes after the weights: 31 whole blocks of 32 tokens at 10 bytes a token.
        let f = fit(1_000, None, 10, 0, 11_000, 8192, 5_000.0);
        assert_eq!((f.max_context, f.decode_tok_s_bound, f.active_bytes), (992, 5.0, 1_000));
        assert_eq!(fit(2_000, None, 10, 0, 1_000, 8192, 1.0).max_context, 0, "weights over the budget");
    }

    #[test]
    fn a_hybrid_models_state_and_checkpoints_come_off_the_context() {
        // 100,000 bytes after the weights, 10 bytes a token, a 20,000-byte state: the live
        // state, a checkpoint per 2,048 tokens and one near the prompt's end.
        let f = fit(1_000, None, 10, 20_000, 101_000, 8192, 1.0);
        assert_eq!((f.state_bytes, f.max_context), (20_000, 4_000), "three states and 4,000 tokens of KV");
        assert_eq!(fit(1_000, None, 10, 0, 101_000, 8192, 1.0).max_context, 9_984, "without states");
    }

    #[test]
    fn experts_count_whole_in_memory_and_by_share_in_the_decode_bound() {
        // 1,000 bytes of attention and the rest, 8,000 of experts of which 2 of 8 are read.
        let f = fit(9_000, Some(Experts { bytes: 8_000, used: 2, count: 8 }), 10, 0, 19_000, 8192, 6_000.0);
        assert_eq!((f.max_context, f.active_bytes, f.decode_tok_s_bound), (992, 3_000, 2.0));
    }
}
