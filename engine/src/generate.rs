//! Generation for one sequence run alone (the state machine is `sequence::Sequence`):
//! chunked prefill, then decode one token at a time until an end-of-generation token, a
//! stop string, `max_tokens`, the context limit, or the observer cancels. Cancellation is checked between prefill chunks and
//! after every decoded token, so a client that goes away costs at most one step.
//! With a grammar, every step's logits are masked to what the grammar allows before
//! sampling (greedy and sampled alike), and a grammar that is complete ends generation.

use std::time::Duration;

use crate::error::Result;
use crate::grammar::Grammar;
use crate::kv::SeqCache;
use crate::model::Model;
use crate::sampler::SamplingParams;
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;

/// Prompt tokens per forward pass during prefill (llama.cpp's default batch).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Report each token's log probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Constrained decoding: only tokens this grammar allows are sampled.
    pub grammar: Option<Grammar>,
}

/// One generated token as observers see it.
#[derive(Clone, Debug)]
pub struct TokenOut {
    pub id: u32,
    /// Text this token releases (possibly empty while a stop string or a multi-byte
    /// character is pending).
    pub text: String,
    /// Log probability under the model's distribution (before sampling adjustments).
    pub logprob: Option<f32>,
    /// The most likely tokens at this step, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// The observer asked to stop (client went away).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Receives generated text as it becomes final.
pub trait Observer {
    /// Polled between prefill chunks: `false` cancels.
    fn keep_going(&mut self) -> bool {
        true
    }
    /// One generated token. `false` cancels.
    fn on_token(&mut self, tok: &TokenOut) -> bool;
    /// Text released at the end that belongs to no single token.
    fn on_flush(&mut self, _text: &str) {}
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was already in the cache (not recomputed).
    pub cached_tokens: usize,
    pub tokens: Vec<u32>,
    pub prefill: Duration,
    pub decode: Duration,
    /// Time spent on grammar masks during decode (zero without a grammar).
    pub mask: Duration,
    /// The stop string that ended generation, if one did.
    pub stop: Option<String>,
    /// Whether a forward pass of this request also carried other requests.
    pub batched: bool,
}

impl Outcome {
    /// `usage.lane`: `batch` if it shared a forward pass, else `serial`.
    pub fn lane(&self) -> &'static str {
        if self.batched { "batch" } else { "serial" }
    }

    pub fn completion_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens - self.cached_tokens, self.prefill)
    }

    /// Decode rate over the tokens after the first (the first comes from prefill).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.tokens.len().saturating_sub(1), self.decode)
    }
}

/// Log-probabilities of one step's raw logits: `logit - logsumexp(logits)`.
pub(crate) struct LogSoftmax {
    lse: f32,
    logits: Vec<f32>,
    pub(crate) top: Vec<(u32, f32)>,
}

impl LogSoftmax {
    pub(crate) fn new(logits: &[f32], top_n: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let lse = max + sum.ln() as f32;
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let n = top_n.min(idx.len());
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        if n > 0 && n < idx.len() {
            idx.select_nth_unstable_by(n - 1, by_logit);
        }
        idx.truncate(n);
        idx.sort_by(by_logit);
        let top = idx.iter().map(|&i| (i, logits[i as usize] - lse)).collect();
        Self { lse, logits: logits.to_vec(), top }
    }

    pub(crate) fn logprob(&self, id: u32) -> f32 {
        self.logits.get(id as usize).map_or(f32::NEG_INFINITY, |l| l - self.lse)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() { 0.0 } else { n as f64 / d.as_secs_f64() }
}

/// Generate a continuation of `prompt`. `cache` must hold the KV of exactly
/// `prompt[..cache.len()]` (usually nothing); at least one prompt token is computed.
/// `ctx` bounds prompt plus generated tokens. The sequence runs alone, prefill in
/// `PREFILL_CHUNK`-token passes.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    cache: &mut SeqCache,
    prompt: &[u32],
    params: GenerateParams,
    ctx: usize,
    obs: &mut dyn Observer,
) -> Result<Outcome> {
    let mut seq = Sequence::new(std::mem::replace(cache, model.new_cache()), prompt, params, ctx)?;
    let result = drive(model, tokenizer, &mut seq, obs);
    let (out, c) = seq.into_parts();
    *cache = c;
    result.map(|()| out)
}

fn drive(model: &Model, tokenizer: &Tokenizer, seq: &mut Sequence, obs: &mut dyn Observer) -> Result<()> {
    while !seq.is_done() {
        if seq.prefilling() && !obs.keep_going() {
            seq.cancel(obs);
            break;
        }
        let mut row = [seq.input(PREFILL_CHUNK)];
        let logits = model.forward_batch(&mut row)?.pop().unwrap_or_default();
        seq.advance(logits, tokenizer, obs)?;
    }
    Ok(())
}
