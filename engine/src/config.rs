//! Model hyperparameters read from GGUF metadata, validated once into an immutable
//! `ModelConfig` that the architectures and the KV cache size themselves from.

use crate::error::{Error, Result};
use crate::gguf::Gguf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 2/3, Mistral-style GQA): RMSNorm, SwiGLU, rotary
    /// embedding on interleaved pairs (GGUF permutes Q/K for it).
    Llama,
    /// Gemma 3: pre+post norms, Q/K norms, GeGLU, sliding-window layers with their own
    /// rotary base, embedding scaled by sqrt(hidden).
    Gemma3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Context length the model was trained for.
    pub ctx_train: usize,
    pub rms_eps: f32,
    /// Rotary base of full-attention layers.
    pub rope_base: f32,
    /// Rotary base of sliding-window layers (Gemma 3: 10,000).
    pub rope_base_local: f32,
    /// Sliding-window size in tokens, for the layers marked in `is_swa`.
    pub sliding_window: Option<usize>,
    /// Per layer: does it attend only to the last `sliding_window` positions?
    pub is_swa: Vec<bool>,
}

impl ModelConfig {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch_name = g.architecture()?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(Error::UnsupportedArch { arch: other.to_owned() });
            }
        };
        let k = |suffix: &str| format!("{arch_name}.{suffix}");
        let n_layers = g.u32(&k("block_count"))? as usize;
        let hidden = g.u32(&k("embedding_length"))? as usize;
        let n_heads = g.u32(&k("attention.head_count"))? as usize;
        let n_kv_heads = g.opt_u32(&k("attention.head_count_kv")).map_or(n_heads, |v| v as usize);
        let head_dim = g.opt_u32(&k("attention.key_length")).map_or_else(|| hidden / n_heads.max(1), |v| v as usize);
        let vocab = g.dims("token_embd.weight")?.first().copied().unwrap_or(0);
        let sliding_window = match arch {
            Arch::Gemma3 => g.opt_u32(&k("attention.sliding_window")).map(|v| v as usize),
            Arch::Llama => None,
        };
        // Gemma 3: five sliding-window layers, then one global (llama.cpp's pattern 6),
        // unless the file states the pattern per layer.
        let is_swa = match (arch, sliding_window) {
            (Arch::Gemma3, Some(w)) if w > 0 => match g.i32_array(&k("attention.sliding_window_pattern")) {
                Ok(v) if v.len() == n_layers => v.iter().map(|&x| x != 0).collect(),
                _ => (0..n_layers).map(|il| il % 6 < 5).collect(),
            },
            _ => vec![false; n_layers],
        };
        let cfg = Self {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn: g.u32(&k("feed_forward_length"))? as usize,
            vocab,
            ctx_train: g.opt_u32(&k("context_length")).unwrap_or(2048) as usize,
            rms_eps: g.f32(&k("attention.layer_norm_rms_epsilon"))?,
            rope_base: g.opt_f32(&k("rope.freq_base")).unwrap_or(10_000.0),
            rope_base_local: g.opt_f32(&k("rope.freq_base_swa")).unwrap_or(10_000.0),
            sliding_window: sliding_window.filter(|&w| w > 0),
            is_swa,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |key: &str| Err(Error::Metadata { key: key.to_owned() });
        if self.n_layers == 0 || self.n_layers > 1024 {
            return bad("block_count");
        }
        if self.hidden == 0 || self.n_heads == 0 || self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("attention.head_count / key_length");
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("attention.head_count_kv");
        }
        if self.vocab == 0 || self.ffn == 0 {
            return bad("feed_forward_length / vocabulary");
        }
        Ok(())
    }

    /// K (or V) floats per token per layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}
