//! One sequence's generation as a state machine, so a scheduler can run many in one
//! forward pass: `input()` says what to run next (a prefill chunk, or the last sampled
//! token), the caller runs it (alone or batched with other sequences), and `advance()`
//! takes that pass's logits — masking with the grammar, sampling, stop strings,
//! `max_tokens`, streaming text to the observer. `generate::generate` is the same
//! machine driven alone. The words of generation live here (`GenerateParams` in,
//! `TokenOut` to the `Observer`, `Outcome` at the end), so `generate` and the scheduler
//! both import this file and it imports neither.

use std::time::{Duration, Instant};

use crate::checkpoint;
use crate::detok::Utf8Stream;
use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::kv::SeqCache;
use crate::model::{Logits, Row};
use crate::sampler::{Sampler, SamplingParams};
use crate::speculate::{SpecCounts, Speculate, Speculator};
use crate::stop::{StopMatcher, StopScan};
use crate::tokenizer::Tokenizer;

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
    /// Draft and verify several tokens a pass (never changes the tokens).
    pub speculate: Speculate,
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
    /// Draft tokens verified and kept, when the request speculated.
    pub speculation: Option<SpecCounts>,
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

pub struct Sequence {
    prompt: Vec<u32>,
    cache: SeqCache,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// Tokens handed out by the last `input()` (fed once `advance` succeeds).
    pending: usize,
    /// The token to run next in decode.
    last: Option<u32>,
    /// Decode's row: the last token, then any draft being verified.
    feed: Vec<u32>,
    spec: Option<Speculator>,
    max_tokens: usize,
    out: Outcome,
    sampler: Sampler,
    history: Vec<u32>,
    utf8: Utf8Stream,
    stops: StopMatcher,
    grammar: Option<Grammar>,
    logprobs: Option<usize>,
    ignore_eos: bool,
    started: Instant,
    decode_started: Option<Instant>,
    done: bool,
    /// Snapshot the recurrent state while reading the prompt (a hybrid model's sequence).
    snapshots: bool,
}

impl Sequence {
    /// `cache` must hold the KV of exactly `prompt[..cache.len()]` (usually nothing); at
    /// least one prompt token is computed. `ctx` bounds prompt plus generated tokens.
    pub fn new(mut cache: SeqCache, prompt: &[u32], params: GenerateParams, ctx: usize) -> Result<Self> {
        if prompt.is_empty() {
            return Err(Error::Tokenizer("the prompt is empty".into()));
        }
        if prompt.len() >= ctx {
            return Err(Error::ContextExceeded { prompt: prompt.len(), ctx });
        }
        cache.truncate(prompt.len() - 1);
        // The state it resumes from stays a checkpoint (often the end of an earlier
        // request, which this sequence's cache entry will supersede).
        cache.checkpoint();
        let cached = cache.len();
        let cache_has_state = cache.has_recurrent();
        Ok(Sequence {
            prompt: prompt.to_vec(),
            cache,
            fed: cached,
            pending: 0,
            last: None,
            feed: Vec::new(),
            // A recurrent state cannot be cut back to a rejected draft's position.
            spec: if cache_has_state { None } else { Speculator::new(params.speculate, prompt) },
            max_tokens: params.max_tokens.min(ctx - prompt.len()),
            out: Outcome {
                finish: FinishReason::Length,
                prompt_tokens: prompt.len(),
                cached_tokens: cached,
                tokens: Vec::new(),
                prefill: Duration::ZERO,
                decode: Duration::ZERO,
                mask: Duration::ZERO,
                stop: None,
                batched: false,
                speculation: None,
            },
            sampler: Sampler::new(params.sampling),
            history: prompt.to_vec(),
            utf8: Utf8Stream::new(),
            stops: StopMatcher::new(params.stop),
            grammar: params.grammar,
            logprobs: params.logprobs,
            ignore_eos: params.ignore_eos,
            started: Instant::now(),
            decode_started: None,
            done: false,
            snapshots: cache_has_state,
        })
    }

    /// Whether the model keeps a recurrent state (a hybrid): then the state is snapshot
    /// while reading the prompt (on by default for a cache that has one; a hybrid
    /// model's fresh sequence has none yet), and the sequence never speculates — its
    /// state cannot be rolled back past a rejected draft.
    pub fn with_snapshots(mut self, on: bool) -> Self {
        self.snapshots = on;
        if on {
            self.spec = None;
        }
        self
    }

    /// Whether the model verifies drafts exactly (`Model::speculates`); off, the
    /// sequence never speculates, whatever the request asked (`usage.speculation` is
    /// then absent).
    pub fn with_speculation(mut self, on: bool) -> Self {
        if !on {
            self.spec = None;
        }
        self
    }

    /// Its next pass carries other sequences too.
    pub fn mark_batched(&mut self) {
        self.out.batched = true;
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.out.tokens.len()
    }

    /// Still reading its prompt.
    pub fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// What to run next: up to `chunk` prompt tokens (logits only for the prompt's last
    /// one), or the last sampled token — followed, when the sequence speculates, by the
    /// draft worth verifying at `draft_cost` (`speculate::policy`; every position's
    /// logits). A sequence that snapshots its recurrent state ends its chunks where it
    /// does (`checkpoint::chunk_end`).
    pub fn input(&mut self, chunk: usize, draft_cost: f64) -> Row<'_> {
        if self.prefilling() {
            let end = if self.snapshots {
                checkpoint::chunk_end(self.fed, chunk, self.prompt.len())
            } else {
                (self.fed + chunk.max(1)).min(self.prompt.len())
            };
            self.pending = end - self.fed;
            let logits = if end == self.prompt.len() { Logits::Last } else { Logits::None };
            return Row { tokens: &self.prompt[self.fed..end], cache: &mut self.cache, logits };
        }
        self.feed.clear();
        self.feed.extend(self.last);
        if let (Some(spec), false) = (self.spec.as_mut(), self.feed.is_empty()) {
            // Room for the draft and the token sampled after it.
            let room = self.max_tokens.saturating_sub(self.out.tokens.len() + 1);
            self.feed.extend_from_slice(spec.plan(draft_cost, room));
        }
        self.pending = self.feed.len();
        let logits = if self.feed.len() > 1 { Logits::All } else { Logits::Last };
        Row { tokens: &self.feed, cache: &mut self.cache, logits }
    }

    /// Take the logits of the pass that ran `input()`. Streams the sampled token to
    /// `obs` — with a draft, each position's in turn while they agree with the draft,
    /// then the KV of the positions after the last kept one is dropped. A `false` from
    /// the observer cancels.
    pub fn advance(&mut self, mut logits: Vec<f32>, tokenizer: &Tokenizer, obs: &mut dyn Observer) -> Result<()> {
        if self.prefilling() {
            self.fed += self.pending;
            if checkpoint::snapshot_due(self.fed, self.prompt.len()) {
                self.cache.checkpoint();
            }
            if self.prefilling() {
                return Ok(());
            }
            self.out.prefill = self.started.elapsed();
            self.decode_started = Some(Instant::now());
        }
        let draft = self.spec.as_ref().map_or(&[][..], |s| s.draft()).to_vec();
        if draft.is_empty() {
            return self.take(logits, tokenizer, obs);
        }
        let positions = draft.len() + 1;
        let vocab = logits.len() / positions;
        // Positions whose logits were used: their KV stays.
        let (mut used, mut accepted) = (0, 0);
        for (i, row) in logits.chunks_exact_mut(vocab).enumerate() {
            used += 1;
            let before = self.out.tokens.len();
            self.take(row.to_vec(), tokenizer, obs)?;
            let kept = (self.out.tokens.len() > before).then(|| self.out.tokens[before]);
            if kept.is_some() && kept == draft.get(i).copied() {
                accepted += 1;
            }
            if self.done || kept.is_none() || kept != draft.get(i).copied() {
                break;
            }
        }
        let len = self.cache.len();
        self.cache.truncate(len - positions + used);
        if let Some(s) = self.spec.as_mut() {
            s.verified(accepted);
        }
        Ok(())
    }

    /// The per-token path every emitted token takes: grammar mask, sampling, end of
    /// generation, stop strings, logprobs, the observer.
    fn take(&mut self, mut logits: Vec<f32>, tokenizer: &Tokenizer, obs: &mut dyn Observer) -> Result<()> {
        if self.out.tokens.len() >= self.max_tokens {
            self.finish(FinishReason::Length, obs);
            return Ok(());
        }
        let lp = self.logprobs.map(|n| LogSoftmax::new(&logits, n));
        if let Some(g) = self.grammar.as_mut() {
            g.mask(&mut logits).map_err(Error::Grammar)?;
        }
        let id = self.sampler.sample(&mut logits, &self.history);
        if !self.ignore_eos && tokenizer.is_eog(id) {
            self.finish(FinishReason::Stop, obs);
            return Ok(());
        }
        let grammar_done = match self.grammar.as_mut() {
            Some(g) => {
                g.accept(id).map_err(Error::Grammar)?;
                g.is_finished()
            }
            None => false,
        };
        self.out.tokens.push(id);
        self.history.push(id);
        if let Some(s) = self.spec.as_mut() {
            s.emitted(id);
        }
        let text = self.utf8.push(tokenizer.piece(id));
        let (text, stopped) = match self.stops.push(&text) {
            StopScan::Continue(t) => (t, false),
            StopScan::Stopped(t) => (t, true),
        };
        let (logprob, top) = match &lp {
            Some(l) => (Some(l.logprob(id)), l.top.clone()),
            None => (None, Vec::new()),
        };
        if !obs.on_token(&TokenOut { id, text, logprob, top }) {
            self.finish(FinishReason::Cancelled, obs);
        } else if stopped || grammar_done {
            self.finish(FinishReason::Stop, obs);
        } else if self.out.tokens.len() == self.max_tokens {
            self.finish(FinishReason::Length, obs);
        } else {
            self.last = Some(id);
        }
        Ok(())
    }

    /// End now (the observer went away, or the engine is draining).
    pub fn cancel(&mut self, obs: &mut dyn Observer) {
        if !self.done {
            self.finish(FinishReason::Cancelled, obs);
        }
    }

    fn finish(&mut self, reason: FinishReason, obs: &mut dyn Observer) {
        self.done = true;
        self.out.finish = reason;
        if self.prefilling() {
            self.out.prefill = self.started.elapsed();
        }
        if reason != FinishReason::Cancelled {
            let tail = self.utf8.finish();
            let rest = match self.stops.push(&tail) {
                StopScan::Continue(t) | StopScan::Stopped(t) => t,
            };
            let flushed = rest + &self.stops.flush();
            if !flushed.is_empty() {
                obs.on_flush(&flushed);
            }
        }
        self.out.decode = self.decode_started.map_or(Duration::ZERO, |s| s.elapsed());
        self.out.mask = self.grammar.as_ref().map_or(Duration::ZERO, |g| g.cost().0);
        self.out.stop = self.stops.matched().map(str::to_owned);
        self.out.speculation = self.spec.as_ref().map(|s| s.counts);
    }

    /// The outcome and the cache (the prompt plus every generated token but the last,
    /// whose KV was never computed), its recurrent state fetched from the device if a
    /// pass left it there (a cache whose state cannot be fetched is emptied: the prompt
    /// cache must not keep positions without their state).
    pub fn into_parts(mut self) -> (Outcome, SeqCache) {
        if let Err(e) = self.cache.settle() {
            tracing::warn!(error = %e, "recurrent state not fetched from the device; its cache entry is dropped");
            self.cache.clear();
        }
        (self.out, self.cache)
    }
}
