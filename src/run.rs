//! `corral run`: load a model in-process, generate once, print timings.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use corral_engine::chat::ChatMessage;
use corral_engine::generate::{GenerateParams, Observer, TokenOut, generate};
use corral_engine::sampler::SamplingParams;
use corral_engine::{Engine, threads};

#[derive(Args)]
pub struct RunArgs {
    /// Model file path, or a model id from the models directory.
    #[arg(long, short, env = "CORRAL_MODEL")]
    model: String,
    /// The prompt text.
    #[arg(long, short)]
    prompt: String,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, alias = "temp", default_value_t = 0.8)]
    temperature: f32,
    /// Top-k truncation; 0 is off.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus) truncation; 1 is off.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p truncation; 0 is off.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty over the last 64 tokens; 1 is off.
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Random seed (same seed, same output).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context size in tokens (prompt + generation).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Compute threads (default: physical cores).
    #[arg(long, env = "CORRAL_THREADS")]
    threads: Option<usize>,
    /// Compute device: auto (a usable NVIDIA GPU, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", env = "CORRAL_DEVICE")]
    device: corral_engine::backend::DeviceChoice,
    /// Speculative decoding: `ngram` drafts from the prompt and output and verifies
    /// several tokens a pass (the same tokens; docs/speculation.md).
    #[arg(long, value_name = "off|ngram", default_value = "off", env = "CORRAL_SPECULATE")]
    speculate: corral_engine::speculate::Speculate,
    /// Models directory for ids.
    #[arg(long, env = "CORRAL_MODELS_DIR")]
    models_dir: Option<std::path::PathBuf>,
}

struct Stdout(std::io::StdoutLock<'static>);

impl Observer for Stdout {
    fn on_token(&mut self, tok: &TokenOut) -> bool {
        // A closed stdout (e.g. `| head`) ends generation instead of failing.
        self.0.write_all(tok.text.as_bytes()).and_then(|_| self.0.flush()).is_ok()
    }
    fn on_flush(&mut self, text: &str) {
        let _ = self.0.write_all(text.as_bytes());
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    threads::init(args.threads);
    let dir = args.models_dir.clone().unwrap_or_else(corral_pool::registry::default_models_dir);
    let entry = crate::models::resolve(&args.model, &dir)?;
    let engine = Engine::load_with(&entry.path, None, args.device)?;
    eprintln!(
        "corral: loaded {} ({}, {} layers) in {:.2} s",
        entry.id,
        engine.config().arch.name(),
        engine.config().n_layers,
        engine.load_time.as_secs_f64()
    );
    let prompt = if args.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(ChatMessage::new("system", s));
        }
        msgs.push(ChatMessage::new("user", &args.prompt));
        engine.chat_prompt(&msgs)?
    } else {
        engine.raw_prompt(&args.prompt)?
    };
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repeat_penalty,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop: args.stop,
        ignore_eos: false,
        logprobs: None,
        grammar: None,
        speculate: args.speculate,
    };
    let mut cache = engine.model.new_cache();
    let mut out = Stdout(std::io::stdout().lock());
    let o = generate(&engine.model, &engine.tokenizer, &mut cache, &prompt, params, args.ctx, &mut out)?;
    let _ = writeln!(out.0);
    eprintln!(
        "corral: prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s; finish {}",
        o.prompt_tokens,
        o.prefill_tok_s(),
        o.completion_tokens(),
        o.decode_tok_s(),
        o.finish.as_str()
    );
    if let Some(s) = o.speculation {
        eprintln!("corral: speculation drafted {} tokens, accepted {}", s.drafted, s.accepted);
    }
    Ok(())
}
