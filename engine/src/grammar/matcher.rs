//! Compiling grammars for one model and running them while decoding.
//!
//! `Grammars` holds llguidance's parser factory for the model's vocabulary; it is built
//! on first use (a model that never sees a constraint pays nothing). `Grammar` is one
//! request's matcher: before each sampling step it masks the logits of every token the
//! grammar cannot take next (end-of-generation tokens only once the grammar may end),
//! and after it the chosen token advances the matcher. The first mask is computed at
//! compile time, so a grammar that cannot even start fails before the response does.
//! JSON grammars also get the digit-run guard (`digits.rs`).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{SimpleVob, TokEnv};

use super::vocab::Vocab;
use crate::tokenizer::Tokenizer;

pub struct Grammars {
    vocab: Arc<Vocab>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    pub fn new(tok: &Tokenizer) -> Self {
        Self { vocab: Arc::new(Vocab::new(tok)), factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let start = Instant::now();
                let env: TokEnv = self.vocab.clone();
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                // llguidance would print to stderr, which is the engine's JSON log.
                f.quiet();
                tracing::info!(ms = start.elapsed().as_millis() as u64, "grammar engine ready");
                Ok(f)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compile a grammar; the error says why it cannot be enforced. `json`: the output
    /// is JSON, so runaway digit runs are cut (`digits.rs`).
    pub fn compile(&self, grammar: TopLevelGrammar, json: bool) -> Result<Grammar, String> {
        let start = Instant::now();
        let parser = self.factory()?.create_parser(grammar).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        for w in matcher.grammar_warnings() {
            tracing::debug!(warning = %w, "grammar");
        }
        let first = matcher.compute_mask().map_err(|e| e.to_string())?;
        if first.is_zero() {
            return Err("the grammar allows no token at the start".into());
        }
        tracing::debug!(us = start.elapsed().as_micros() as u64, "grammar compiled");
        let digits = json.then(|| self.vocab.clone());
        Ok(Grammar { matcher, next_mask: Some(first), digits, run: 0, mask_time: Duration::ZERO, steps: 0 })
    }
}

pub struct Grammar {
    matcher: Matcher,
    /// A mask computed ahead (at compile time, for the first step).
    next_mask: Option<SimpleVob>,
    /// JSON output: the vocabulary's digit table, for the digit-run guard.
    digits: Option<Arc<Vocab>>,
    /// Consecutive digits at the end of the output so far.
    run: usize,
    mask_time: Duration,
    steps: u64,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("steps", &self.steps).finish_non_exhaustive()
    }
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            next_mask: self.next_mask.clone(),
            digits: self.digits.clone(),
            run: self.run,
            mask_time: self.mask_time,
            steps: self.steps,
        }
    }
}

impl Grammar {
    /// Set the logit of every token the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let start = Instant::now();
        let mut mask = match self.next_mask.take() {
            Some(m) => m,
            None => self.matcher.compute_mask().map_err(|e| e.to_string())?,
        };
        if let Some(v) = &self.digits {
            v.digits.limit(self.run, &mut mask);
        }
        apply(&mask, logits);
        self.mask_time += start.elapsed();
        self.steps += 1;
        Ok(())
    }

    /// Advance past the sampled token.
    pub fn accept(&mut self, id: u32) -> Result<(), String> {
        if let Some(v) = &self.digits {
            self.run = v.digits.next_run(self.run, id);
        }
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    /// The grammar is complete and admits nothing more: generation ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Time spent computing and applying masks, and the number of steps.
    pub fn cost(&self) -> (Duration, u64) {
        (self.mask_time, self.steps)
    }
}

/// Disallowed tokens get -inf; whole words of allowed tokens are skipped. Logits past
/// the mask's length (a padded output layer) are never allowed.
fn apply(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        let w = words.get(i).copied().unwrap_or(0);
        if w == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if w & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_masks_exactly_the_unset_bits() {
        let mut m = SimpleVob::alloc(70);
        for t in [0, 31, 32, 69] {
            m.allow_token(t);
        }
        let mut logits = vec![1.0f32; 72];
        apply(&m, &mut logits);
        for (i, l) in logits.iter().enumerate() {
            assert_eq!(l.is_finite(), [0, 31, 32, 69].contains(&i), "token {i}");
        }
    }
}
