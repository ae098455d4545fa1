//! Model architectures: one file per architecture, each a forward pass over a batch of
//! sequences (`backend::batch::Row`: token ids and the external `SeqCache` they read and
//! append to), written once over `crate::backend::Backend` ops. A single sequence is a batch
//! of one.

mod gemma3;
mod gptoss;
mod llama;
mod qwen35;

use std::sync::Arc;

use crate::backend::cpu::Cpu;
use crate::backend::cuda::CudaBackend;
use crate::backend::{Backend, DeviceChoice, DeviceKind};
use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::Numerics;
use crate::kv::{KvShape, SeqCache};

/// A forward pass's input rows and what each returns: the backend's batch, named here
/// too because `Model::forward_batch` takes them.
pub use crate::backend::batch::{Logits, Row};

pub trait Architecture: Send + Sync {
    /// Run each row's tokens at positions `cache.len()..` of its own cache, append their
    /// K/V, and return each row's requested logits. Rows are non-empty. On error every
    /// cache keeps its previous length.
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>>;
    /// The context the model is served with, where the math depends on it (phi3's
    /// LongRoPE factors, as llama.cpp picks them by its context size). Before any call:
    /// a context within the model's original one.
    fn set_context(&self, _ctx: usize) {}
}

/// A loaded model: weights, config, and the shape of its KV cache.
#[derive(Clone)]
pub struct Model {
    config: Arc<ModelConfig>,
    arch: Arc<dyn Architecture>,
    numerics: Numerics,
    device: DeviceKind,
    /// The GPU the model lives on (for memory figures), if any.
    gpu: Option<CudaBackend>,
}

fn build<B: Backend>(b: B, g: &Gguf, config: &ModelConfig) -> Result<Arc<dyn Architecture>> {
    Ok(match config.arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Mistral3 | Arch::Phi3 => {
            Arc::new(llama::Llama::load(b, g, config)?)
        }
        Arch::Gemma3 => Arc::new(gemma3::Gemma3::load(b, g, config)?),
        Arch::GptOss => Arc::new(gptoss::GptOss::load(b, g, config)?),
        Arch::Qwen35 | Arch::Qwen35Moe => Arc::new(qwen35::Qwen35::load(b, g, config)?),
    })
}

/// The tensors around the blocks: the embedding table, the final norm, and the output
/// projection (`output.weight`, or the embedding table when tied).
struct Ends<B: Backend> {
    embed: B::Table,
    norm: B::Vector,
    lm_head: B::Matrix,
}

impl<B: Backend> Ends<B> {
    fn load(b: &B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let out = if g.has_tensor("output.weight") { "output.weight" } else { "token_embd.weight" };
        Ok(Self {
            embed: b.table(g, "token_embd.weight", cfg.vocab, cfg.hidden)?,
            norm: b.vector(g, "output_norm.weight", cfg.hidden)?,
            lm_head: b.matrix(g, out, cfg.hidden, cfg.vocab)?,
        })
    }
}

impl Model {
    /// Load on the CPU.
    pub fn load(g: &Gguf) -> Result<Self> {
        Self::load_on(g, DeviceChoice::Cpu)
    }

    /// Load on the chosen device. `Auto` takes GPU 0 when one is usable and says in one
    /// log line why not otherwise; an explicit `cuda:N` that cannot be used is an error.
    pub fn load_on(g: &Gguf, device: DeviceChoice) -> Result<Self> {
        let config = ModelConfig::from_gguf(g)?;
        let gpu = match device {
            DeviceChoice::Cpu => None,
            DeviceChoice::Cuda(n) => Some(CudaBackend::open(n)?),
            DeviceChoice::Auto => CudaBackend::try_open_default(),
        };
        let on_gpu = match gpu {
            None => None,
            Some(b) => match b.check_fit(g.file_len()).and_then(|()| build(b.clone(), g, &config)) {
                Ok(arch) => Some((arch, b)),
                Err(e) if device == DeviceChoice::Auto => {
                    tracing::info!(reason = %e, "model cannot run on the GPU, using the CPU");
                    None
                }
                Err(e) => return Err(e),
            },
        };
        let (arch, device, gpu) = match on_gpu {
            Some((arch, b)) => (arch, b.kind(), Some(b)),
            None => (build(Cpu, g, &config)?, DeviceKind::Cpu, None),
        };
        tracing::info!(device = %device.label(), "model loaded");
        Ok(Self { config: Arc::new(config), arch, numerics: Numerics::default(), device, gpu })
    }

    /// On a GPU, the bytes of KV its memory can mirror now (free memory less headroom);
    /// `None` on the CPU.
    pub fn device_kv_capacity(&self) -> Option<u64> {
        let b = self.gpu.as_ref()?;
        let (free, _) = b.gpu().memory().ok()?;
        Some(crate::backend::cuda::fit::kv_capacity(free as u64))
    }

    /// The device and, on a GPU, its memory (total, and used by every process).
    pub fn device_stats(&self) -> corral_protocol::engine_wire::DeviceStats {
        let (name, (free, total)) = match (&self.device, &self.gpu) {
            (DeviceKind::Cuda { name, .. }, Some(b)) => (name.clone(), b.gpu().memory().unwrap_or((0, 0))),
            _ => (String::new(), (0, 0)),
        };
        corral_protocol::engine_wire::DeviceStats {
            kind: self.device.label(),
            name,
            memory_total_bytes: total as u64,
            memory_used_bytes: total.saturating_sub(free) as u64,
        }
    }

    /// On a GPU, run decode steps through CUDA graphs (the default) or eagerly.
    #[cfg(test)]
    pub(crate) fn set_cuda_graphs(&self, on: bool) {
        if let Some(b) = &self.gpu {
            b.set_graphs(on);
        }
    }

    /// What the model runs on.
    pub fn device(&self) -> &DeviceKind {
        &self.device
    }

    /// Choose the kernels' arithmetic (see `Numerics`; batch-invariant by default).
    pub fn set_numerics(&mut self, n: Numerics) {
        self.numerics = n;
    }

    /// The context this model is served with (`Architecture::set_context`).
    pub fn set_context(&self, ctx: usize) {
        self.arch.set_context(ctx);
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The KV cache's shape: the layers that attend (a hybrid model's recurrent layers
    /// keep their state beside it, `SeqCache::recurrent_mut`).
    pub fn kv_shape(&self) -> KvShape {
        KvShape { n_layers: self.config.kv_layers(), kv_dim: self.config.kv_dim() }
    }

    /// Whether sequences carry recurrent state besides their KV (a hybrid model): such a
    /// sequence restores only from its state checkpoints (`crate::checkpoint`).
    pub fn recurrent(&self) -> bool {
        self.config.hybrid.is_some()
    }

    /// Whether its sequences may speculate (`crate::speculate`): verifying a draft must
    /// give exactly the decode steps' logits — not for a hybrid, whose state cannot be cut
    /// back to a rejected draft. (On the CUDA backend, verify rows run on the decode
    /// step's kernels: `backend::cuda::tests_model::cuda_verify_rows_equal_decode_steps`.)
    pub fn speculates(&self) -> bool {
        !self.recurrent()
    }

    /// The recurrent state's shape of a hybrid model (what a cache file's states must match).
    pub fn recurrent_shape(&self) -> Option<crate::recurrent::RecurrentShape> {
        self.config.recurrent_shape()
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
        // A hybrid's decode step may replay a CUDA graph without running the model's
        // forward: every row's recurrent state must exist before the pass is planned.
        if let Some(shape) = self.recurrent_shape()
            && !rows.iter_mut().filter(|r| !r.tokens.is_empty()).all(|r| r.cache.ensure_recurrent(shape))
        {
            return Err(crate::backend::missing_state());
        }
        let run = |rows: &mut [Row<'_>]| {
            crate::kernels::with_numerics(self.numerics, || match &self.gpu {
                Some(b) => b.step(vocab, rows, |rows| self.arch.forward(rows)),
                None => self.arch.forward(rows),
            })
        };
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
