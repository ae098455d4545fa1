//! `corral bench`: llama-bench-style throughput of the engine in-process: prefill of a
//! synthetic prompt (`pp`) and decode of greedy tokens (`tg`) from an empty context or
//! after `--depth` tokens,
//! printed as one JSON line per repetition for `scripts/bench/engine`.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use corral_engine::model::Logits;
use corral_engine::sampler::argmax;
use corral_engine::{Engine, threads};

#[derive(Args)]
pub struct BenchArgs {
    /// Model file path, or a model id from the models directory.
    #[arg(long, short)]
    model: String,
    /// Prompt tokens to prefill.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to decode.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Context already in the cache when decoding starts (llama-bench's `-d`): the first
    /// `depth` tokens of a synthetic prompt, prefilled untimed.
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Compute threads (default: physical cores).
    #[arg(long, env = "CORRAL_THREADS")]
    threads: Option<usize>,
    /// Compute device: auto (a usable NVIDIA GPU, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", env = "CORRAL_DEVICE")]
    device: corral_engine::backend::DeviceChoice,
    /// Models directory for ids.
    #[arg(long, env = "CORRAL_MODELS_DIR")]
    models_dir: Option<std::path::PathBuf>,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    threads::init(args.threads);
    let dir = args.models_dir.clone().unwrap_or_else(corral_pool::registry::default_models_dir);
    let entry = crate::models::resolve(&args.model, &dir)?;
    let engine = Engine::load_with(&entry.path, None, args.device)?;
    let vocab = engine.config().vocab as u64;
    // Deterministic pseudo-random prompt (like llama-bench's random tokens).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let prompt: Vec<u32> = (0..args.prompt_tokens.max(args.depth))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab) as u32
        })
        .collect();
    for rep in 0..=args.reps {
        let mut cache = engine.model.new_cache();
        let t = Instant::now();
        for chunk in prompt[..args.prompt_tokens].chunks(corral_engine::generate::PREFILL_CHUNK) {
            engine.model.forward(chunk, &mut cache, Logits::Last)?;
        }
        let pp = t.elapsed().as_secs_f64();

        let mut cache = engine.model.new_cache();
        for chunk in prompt[..args.depth].chunks(corral_engine::generate::PREFILL_CHUNK) {
            engine.model.forward(chunk, &mut cache, Logits::Last)?;
        }
        let mut tok = engine.tokenizer.bos().or(prompt.first().copied()).unwrap_or(0);
        let t = Instant::now();
        for _ in 0..args.gen_tokens {
            let logits = engine.model.forward(&[tok], &mut cache, Logits::Last)?;
            tok = argmax(&logits);
        }
        let tg = t.elapsed().as_secs_f64();
        if rep > 0 {
            println!(
                "{}",
                serde_json::json!({
                    "model": entry.id.as_str(),
                    "rep": rep,
                    "pp_tokens": args.prompt_tokens,
                    "pp_tok_s": args.prompt_tokens as f64 / pp,
                    "tg_tokens": args.gen_tokens,
                    "tg_depth": args.depth,
                    "tg_tok_s": args.gen_tokens as f64 / tg,
                    "cpu_kernels": corral_engine::kernels::cpu_isa(),
                })
            );
        }
    }
    Ok(())
}
