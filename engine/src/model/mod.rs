//! Model architectures: one file per architecture, each a forward pass over a batch of
//! sequences (`batch::Row`: token ids and the external `SeqCache` they read and append
//! to). A single sequence is a batch of one.

pub mod batch;
mod gemma3;
mod llama;

use std::sync::Arc;

use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::Numerics;
use crate::kv::{KvShape, SeqCache};

pub use batch::Row;

/// Which rows of logits a forward pass should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that is not the last).
    None,
    /// Only the last position's (`[vocab]`).
    Last,
    /// Every position's (`[T][vocab]`, for scoring/teacher forcing).
    All,
}

pub trait Architecture: Send + Sync {
    /// Run each row's tokens at positions `cache.len()..` of its own cache, append their
    /// K/V, and return each row's requested logits. Rows are non-empty. On error every
    /// cache keeps its previous length.
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>>;
}

/// A loaded model: weights, config, and the shape of its KV cache.
#[derive(Clone)]
pub struct Model {
    config: Arc<ModelConfig>,
    arch: Arc<dyn Architecture>,
    numerics: Numerics,
}

impl Model {
    pub fn load(g: &Gguf) -> Result<Self> {
        let config = ModelConfig::from_gguf(g)?;
        let arch: Arc<dyn Architecture> = match config.arch {
            Arch::Llama => Arc::new(llama::Llama::load(g, &config)?),
            Arch::Gemma3 => Arc::new(gemma3::Gemma3::load(g, &config)?),
        };
        Ok(Self { config: Arc::new(config), arch, numerics: Numerics::default() })
    }

    /// Choose the kernels' arithmetic (see `Numerics`; batch-invariant by default).
    pub fn set_numerics(&mut self, n: Numerics) {
        self.numerics = n;
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn kv_shape(&self) -> KvShape {
        KvShape { n_layers: self.config.n_layers, kv_dim: self.config.kv_dim() }
    }

    pub fn new_cache(&self) -> SeqCache {
        SeqCache::new(self.kv_shape())
    }

    pub fn forward(&self, tokens: &[u32], cache: &mut SeqCache, logits: Logits) -> Result<Vec<f32>> {
        let mut rows = [Row { tokens, cache, logits }];
        Ok(self.forward_batch(&mut rows)?.pop().unwrap_or_default())
    }

    /// One pass for several sequences (each with its own cache and position); returns
    /// each row's logits, in order. A row's logits are bit-identical to running it alone
    /// (with the default numerics). Rows without tokens get no logits.
    pub fn forward_batch(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let vocab = self.config.vocab;
        for r in rows.iter() {
            if r.cache.shape() != self.kv_shape() {
                return Err(Error::Tensor { name: "kv cache".into(), reason: "belongs to another model".into() });
            }
            if let Some(&id) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::BadToken { id, vocab });
            }
        }
        let run = |rows: &mut [Row<'_>]| crate::kernels::with_numerics(self.numerics, || self.arch.forward(rows));
        if rows.iter().all(|r| !r.tokens.is_empty()) {
            return run(rows);
        }
        let mut busy: Vec<Row<'_>> = rows
            .iter_mut()
            .filter(|r| !r.tokens.is_empty())
            .map(|r| Row { tokens: r.tokens, cache: &mut *r.cache, logits: r.logits })
            .collect();
        let mut logits = if busy.is_empty() { Vec::new() } else { run(&mut busy)? }.into_iter();
        drop(busy);
        Ok(rows
            .iter()
            .map(|r| if r.tokens.is_empty() { Vec::new() } else { logits.next().unwrap_or_default() })
            .collect())
    }
}

/// The output rows a `Logits` mode needs from the final hidden states `[T][hidden]`.
pub(crate) fn output_rows(x: &[f32], hidden: usize, logits: Logits) -> &[f32] {
    match logits {
        Logits::None => &[],
        Logits::Last => &x[x.len() - hidden..],
        Logits::All => x,
    }
}
