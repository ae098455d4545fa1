//! The generation loop for one sequence: chunked prefill, then decode one token at a
//! time until an end-of-generation token, a stop string, `max_tokens`, the context
//! limit, or the observer cancels. Cancellation is checked between prefill chunks and
//! after every decoded token, so a client that goes away costs at most one step.
//! With a grammar, every step's logits are masked to what the grammar allows before
//! sampling (greedy and sampled alike), and a grammar that is complete ends generation.

use std::time::{Duration, Instant};

use crate::detok::Utf8Stream;
use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::kv::SeqCache;
use crate::model::{Logits, Model};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopScan};
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
}

impl Outcome {
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
struct LogSoftmax {
    lse: f32,
    logits: Vec<f32>,
    top: Vec<(u32, f32)>,
}

impl LogSoftmax {
    fn new(logits: &[f32], top_n: usize) -> Self {
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

    fn logprob(&self, id: u32) -> f32 {
        self.logits.get(id as usize).map_or(f32::NEG_INFINITY, |l| l - self.lse)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() { 0.0 } else { n as f64 / d.as_secs_f64() }
}

/// Generate a continuation of `prompt`. `cache` must hold the KV of exactly
/// `prompt[..cache.len()]` (usually nothing); at least one prompt token is computed.
/// `ctx` bounds prompt plus generated tokens.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    cache: &mut SeqCache,
    prompt: &[u32],
    params: GenerateParams,
    ctx: usize,
    obs: &mut dyn Observer,
) -> Result<Outcome> {
    if prompt.is_empty() {
        return Err(Error::Tokenizer("the prompt is empty".into()));
    }
    if prompt.len() >= ctx {
        return Err(Error::ContextExceeded { prompt: prompt.len(), ctx });
    }
    cache.truncate(prompt.len() - 1);
    let cached = cache.len();
    let max_tokens = params.max_tokens.min(ctx - prompt.len());
    let mut out = Outcome {
        finish: FinishReason::Length,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        tokens: Vec::new(),
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        mask: Duration::ZERO,
        stop: None,
    };

    let start = Instant::now();
    let todo = &prompt[cached..];
    let chunks: Vec<&[u32]> = todo.chunks(PREFILL_CHUNK).collect();
    let mut logits = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        if !obs.keep_going() {
            out.finish = FinishReason::Cancelled;
            out.prefill = start.elapsed();
            return Ok(out);
        }
        let last = i + 1 == chunks.len();
        logits = model.forward(chunk, cache, if last { Logits::Last } else { Logits::None })?;
    }
    out.prefill = start.elapsed();

    let decode_start = Instant::now();
    let mut sampler = Sampler::new(params.sampling);
    let mut history = prompt.to_vec();
    let mut utf8 = Utf8Stream::new();
    let mut stops = StopMatcher::new(params.stop);
    let mut grammar = params.grammar;
    while out.tokens.len() < max_tokens {
        let lp = params.logprobs.map(|n| LogSoftmax::new(&logits, n));
        if let Some(g) = grammar.as_mut() {
            g.mask(&mut logits).map_err(Error::Grammar)?;
        }
        let id = sampler.sample(&mut logits, &history);
        if !params.ignore_eos && tokenizer.is_eog(id) {
            out.finish = FinishReason::Stop;
            break;
        }
        let grammar_done = match grammar.as_mut() {
            Some(g) => {
                g.accept(id).map_err(Error::Grammar)?;
                g.is_finished()
            }
            None => false,
        };
        out.tokens.push(id);
        history.push(id);
        let text = utf8.push(tokenizer.piece(id));
        let (text, stopped) = match stops.push(&text) {
            StopScan::Continue(t) => (t, false),
            StopScan::Stopped(t) => (t, true),
        };
        let (logprob, top) = match &lp {
            Some(l) => (Some(l.logprob(id)), l.top.clone()),
            None => (None, Vec::new()),
        };
        if !obs.on_token(&TokenOut { id, text, logprob, top }) {
            out.finish = FinishReason::Cancelled;
            break;
        }
        if stopped || grammar_done {
            out.finish = FinishReason::Stop;
            break;
        }
        if out.tokens.len() == max_tokens {
            break;
        }
        logits = model.forward(&[id], cache, Logits::Last)?;
    }
    if out.finish != FinishReason::Cancelled {
        let tail = utf8.finish();
        let rest = match stops.push(&tail) {
            StopScan::Continue(t) | StopScan::Stopped(t) => t,
        };
        let flushed = rest + &stops.flush();
        if !flushed.is_empty() {
            obs.on_flush(&flushed);
        }
    }
    out.decode = decode_start.elapsed();
    out.mask = grammar.map_or(Duration::ZERO, |g| g.cost().0);
    out.stop = stops.matched().map(str::to_owned);
    Ok(out)
}
