//! Generation for one sequence run alone (the state machine is `sequence::Sequence`):
//! chunked prefill, then decode one token at a time until an end-of-generation token, a
//! stop string, `max_tokens`, the context limit, or the observer cancels. Cancellation is checked between prefill chunks and
//! after every decoded token, so a client that goes away costs at most one step.
//! With a grammar, every step's logits are masked to what the grammar allows before
//! sampling (greedy and sampled alike), and a grammar that is complete ends generation.

use std::time::Instant;

use crate::error::Result;
use crate::kv::SeqCache;
use crate::model::Model;
use crate::scheduler::pacing::Pacer;
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;

/// What a caller of `generate` passes and gets back; they are the sequence's own types.
pub use crate::sequence::{FinishReason, GenerateParams, Observer, Outcome, TokenOut};

/// Prompt tokens per forward pass during prefill (llama.cpp's default batch).
pub const PREFILL_CHUNK: usize = 512;

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
    let mut seq = Sequence::new(std::mem::replace(cache, model.new_cache()), prompt, params, ctx)?
        .with_snapshots(model.recurrent())
        .with_speculation(model.speculates());
    let result = drive(model, tokenizer, &mut seq, obs);
    let (out, c) = seq.into_parts();
    *cache = c;
    result.map(|()| out)
}

fn drive(model: &Model, tokenizer: &Tokenizer, seq: &mut Sequence, obs: &mut dyn Observer) -> Result<()> {
    // Measures what a draft token costs against a decode step (`speculate::policy`).
    let mut pacer = Pacer::default();
    while !seq.is_done() {
        if seq.prefilling() && !obs.keep_going() {
            seq.cancel(obs);
            break;
        }
        let decoding = usize::from(!seq.prefilling());
        let mut row = [seq.input(PREFILL_CHUNK, pacer.token_cost(1))];
        let tokens = row[0].tokens.len();
        let started = Instant::now();
        let logits = model.forward_batch(&mut row)?.pop().unwrap_or_default();
        pacer.observe(decoding, tokens.saturating_sub(decoding), started.elapsed().as_secs_f64());
        seq.advance(logits, tokenizer, obs)?;
    }
    Ok(())
}
