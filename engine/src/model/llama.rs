//! The llama graph and the families that differ from it only in data: llama (SmolLM2,
//! Llama 2/3.x, Mistral-style GQA), qwen2 (Q/K/V biases), qwen3 (RMSNorm on every Q
//! and K head before RoPE, its own head size) and mistral3 (YaRN, Llama 4's optional
//! attention temperature on the queries). Pre-norm blocks, RMSNorm, SwiGLU MLP;
//! rotary pairs interleaved for llama (GGUF's converter permutes Q/K for it), NeoX for
//! the Qwens; Llama 3's per-dimension `rope_freqs` and `rope.scaling.*` (linear, YaRN)
//! shape the angles. Written once over `Backend` ops; runs on the CPU or a GPU.

use crate::backend::batch::Row;
use crate::backend::{Backend, Gate, Rotary};
use crate::config::{Arch, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::ops::RopeAngles;
use crate::model::Architecture;

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    /// Q, K and V biases (qwen2; optional in every family, as in llama.cpp).
    bias: Option<[B::Vector; 3]>,
    /// RMSNorm weights of each Q and K head (qwen3).
    qk_norm: Option<[B::Vector; 2]>,
    wo: B::Matrix,
    ffn_norm: B::Vector,
    w_gate: B::Matrix,
    w_up: B::Matrix,
    w_down: B::Matrix,
}

pub(crate) struct Llama<B: Backend> {
    b: B,
    cfg: ModelConfig,
    ends: super::Ends<B>,
    layers: Vec<Layer<B>>,
    /// Llama 3's per-dimension frequency factors (`rope_freqs.weight`, head_dim/2).
    rope_freqs: Option<Vec<f32>>,
}

/// Tensors llama.cpp would use in these families that this graph has no place for: a
/// file with one is refused rather than run without it.
const UNUSED: &[&str] =
    &["attn_qkv.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate_inp.weight"];

impl<B: Backend> Llama<B> {
    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        // llama.cpp gives the Qwens' rope no frequency factors (it would refuse the file).
        let global: &[&str] = match cfg.arch {
            Arch::Llama | Arch::Mistral3 => &["output.bias", "rope_factors_long.weight"],
            _ => &["output.bias", "rope_factors_long.weight", "rope_freqs.weight"],
        };
        for name in global.iter().map(|s| s.to_string()).chain(UNUSED.iter().map(|s| format!("blk.0.{s}"))) {
            if g.has_tensor(&name) {
                let reason = format!("is not supported in a {} model", cfg.arch.name());
                return Err(Error::Tensor { name, reason });
            }
        }
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                let bias = match g.has_tensor(&format!("blk.{i}.attn_q.bias")) {
                    false => None,
                    true => {
                        let n = |s: &str| format!("blk.{i}.{s}.bias");
                        Some([
                            b.vector(g, &n("attn_q"), q)?,
                            b.vector(g, &n("attn_k"), kv)?,
                            b.vector(g, &n("attn_v"), kv)?,
                        ])
                    }
                };
                let qk_norm = match cfg.arch {
                    Arch::Qwen3 => Some([b.vector(g, &n("attn_q_norm"), hd)?, b.vector(g, &n("attn_k_norm"), hd)?]),
                    _ => None,
                };
                Ok(Layer {
                    attn_norm: b.vector(g, &n("attn_norm"), h)?,
                    wq: b.matrix(g, &n("attn_q"), h, q)?,
                    wk: b.matrix(g, &n("attn_k"), h, kv)?,
                    wv: b.matrix(g, &n("attn_v"), h, kv)?,
                    bias,
                    qk_norm,
                    wo: b.matrix(g, &n("attn_output"), q, h)?,
                    ffn_norm: b.vector(g, &n("ffn_norm"), h)?,
                    w_gate: b.matrix(g, &n("ffn_gate"), h, ff)?,
                    w_up: b.matrix(g, &n("ffn_up"), h, ff)?,
                    w_down: b.matrix(g, &n("ffn_down"), ff, h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rope_freqs = match g.has_tensor("rope_freqs.weight") {
            true => Some(g.f32_tensor("rope_freqs.weight", hd / 2)?),
            false => None,
        };
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), layers, rope_freqs, b })
    }
}

impl<B: Backend> Architecture for Llama<B> {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let angles = RopeAngles {
            head_dim: c.head_dim,
            base: c.rope_base,
            scaling: c.rope_scaling,
            factors: self.rope_freqs.as_deref(),
        };
        // mistral3's attention temperature: each stacked row's query factor.
        let temperature = c.attn_temperature.map(|t| {
            rows.iter()
                .flat_map(|r| (r.cache.len()..r.cache.len() + r.tokens.len()).map(|pos| t.at(pos)))
                .collect::<Vec<f32>>()
        });
        let mut p = b.begin_scaled(rows, &[angles])?;
        let spec = AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            window: None,
        };
        let rope = Rotary { q_heads: c.n_heads, k_heads: c.n_kv_heads, table: 0, style: c.arch.rope_style() };
        let mut x = b.embed(&p, &self.ends.embed)?;
        // The FFN's output, added to `x` together with the next layer's norm.
        let mut ffn_out = None;
        for (il, l) in self.layers.iter().enumerate() {
            let qkv = [&l.wq, &l.wk, &l.wv];
            let [mut q, mut k, mut v] = match ffn_out.take() {
                Some(y) => b.add_norm_matmul_many(&p, &mut x, &y, &l.attn_norm, c.rms_eps, qkv)?,
                None => b.norm_matmul_many(&p, &x, &l.attn_norm, c.rms_eps, qkv)?,
            };
            if let Some([bq, bk, bv]) = &l.bias {
                b.add_bias(&mut q, bq)?;
                b.add_bias(&mut k, bk)?;
                b.add_bias(&mut v, bv)?;
            }
            if let Some([nq, nk]) = &l.qk_norm {
                b.rms_norm_inplace(&mut q, nq, c.rms_eps)?;
                b.rms_norm_inplace(&mut k, nk, c.rms_eps)?;
            }
            let o = match &temperature {
                None => b.rope_attend_matmul(&mut p, rows, il, (&mut q, &mut k, &v), rope, &spec, &l.wo)?,
                Some(t) => {
                    b.rope_qk(&p, (&mut q, &mut k), (rope.q_heads, rope.k_heads), rope.table, rope.style)?;
                    b.scale_rows(&mut q, t)?;
                    b.attend_matmul(&mut p, rows, il, (&q, &k, &v), &spec, &l.wo)?
                }
            };
            let [gate, up] = b.add_norm_matmul_many(&p, &mut x, &o, &l.ffn_norm, c.rms_eps, [&l.w_gate, &l.w_up])?;
            ffn_out = Some(b.gated_matmul(&p, gate, &up, Gate::Silu, &l.w_down)?);
        }
        if let Some(y) = ffn_out {
            b.add(&mut x, &y)?;
        }
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
