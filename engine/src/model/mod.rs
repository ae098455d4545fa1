//! Model architectures: one file per architecture, each a forward pass over token ids
//! that reads and appends to an external `SeqCache`.

mod gemma3;
mod llama;

use std::sync::Arc;

use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::Numerics;
use crate::kv::{KvShape, SeqCache};

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
    /// Run `tokens` at positions `cache.len()..`, append their K/V to `cache`, and
    /// return the requested logits. On error the cache keeps its previous length.
    fn forward(&self, tokens: &[u32], cache: &mut SeqCache, logits: Logits) -> Result<Vec<f32>>;
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
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        if cache.shape() != self.kv_shape() {
            return Err(Error::Tensor { name: "kv cache".into(), reason: "belongs to another model".into() });
        }
        let vocab = self.config.vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::BadToken { id, vocab });
        }
        crate::kernels::with_numerics(self.numerics, || self.arch.forward(tokens, cache, logits))
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
