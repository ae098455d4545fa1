//! The llama graph and the families that differ from it only in data: llama (SmolLM2,
//! Llama 2/3.x, Mistral-style GQA), qwen2 (Q/K/V biases), qwen3 (RMSNorm on every Q
//! and K head before RoPE, its own head size), mistral3 (YaRN, Llama 4's optional
//! attention temperature on the queries) and phi3 (fused Q/K/V and gate|up weights, split
//! by rows at load; LongRoPE factors; queries scaled before attention). Pre-norm blocks,
//! RMSNorm, SwiGLU MLP; rotary pairs interleaved for llama and mistral3 (GGUF's converter
//! permutes Q/K for them), NeoX for the Qwens and phi3; per-dimension frequency factors
//! (Llama 3's `rope_freqs`, phi3's LongRoPE) and `rope.scaling.*` (linear, YaRN) shape the
//! angles. qwen3moe is qwen3 with a mixture of experts in place of every MLP
//! (`Backend::moe`). Written once over `Backend` ops; runs on the CPU or a GPU.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::backend::batch::Row;
use crate::backend::{Backend, Gate, Rotary};
use crate::config::{Arch, AttnTemperature, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::rope::RopeAngles;
use crate::model::Architecture;

/// A factor on the queries between RoPE and attention.
enum QScale {
    /// The attention temperature at each stacked row's position.
    Temperature(AttnTemperature),
    /// The same for every row.
    All(f32),
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    /// Q, K and V biases (qwen2; optional in every family, as in llama.cpp) not taken
    /// into the matmuls by the backend (`Backend::attach_bias`).
    bias: [Option<B::Vector>; 3],
    /// RMSNorm weights of each Q and K head (qwen3).
    qk_norm: Option<[B::Vector; 2]>,
    wo: B::Matrix,
    ffn_norm: B::Vector,
    ffn: Ffn<B>,
}

/// A layer's feed-forward part after its norm.
enum Ffn<B: Backend> {
    /// SwiGLU: `down(silu(gate x) * up x)`.
    Dense { gate: B::Matrix, up: B::Matrix, down: B::Matrix },
    /// A mixture of SwiGLU experts (qwen3moe).
    Experts(B::Experts),
}

pub(crate) struct Llama<B: Backend> {
    b: B,
    cfg: ModelConfig,
    ends: super::Ends<B>,
    layers: Vec<Layer<B>>,
    /// Per-dimension frequency factors (head_dim/2) for a served context within the
    /// original one and beyond it: Llama 3's `rope_freqs.weight` for both, phi3's
    /// LongRoPE `rope_factors_short` / `_long` (llama.cpp's `get_rope_factors`).
    rope_factors: [Option<Vec<f32>>; 2],
    /// The original context (`rope.scaling.original_context_length`, else the training one).
    n_ctx_orig: usize,
    /// Whether the served context exceeds it (`Architecture::set_context`).
    long_context: AtomicBool,
}

/// Tensors llama.cpp would use in these families that this graph has no place for: a
/// file with one is refused rather than run without it.
const UNUSED: &[&str] = &["attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate_inp.weight"];

impl<B: Backend> Llama<B> {
    /// The rotary table of every pass with `factors` (short or long, phi3).
    fn angles<'a>(c: &ModelConfig, factors: Option<&'a [f32]>) -> RopeAngles<'a> {
        RopeAngles { head_dim: c.head_dim, base: c.rope_base, scaling: c.rope_scaling, factors }
    }

    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        // llama.cpp gives the Qwens' rope no frequency factors (it would refuse the file),
        // phi3 only LongRoPE's, llama and mistral3 only `rope_freqs`; only phi3 has fused
        // Q/K/V.
        let phi3 = cfg.arch == Arch::Phi3;
        let global: &[&str] = match cfg.arch {
            Arch::Llama | Arch::Mistral3 => &["output.bias", "rope_factors_long.weight", "rope_factors_short.weight"],
            Arch::Phi3 => &["output.bias", "rope_freqs.weight"],
            _ => &["output.bias", "rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight"],
        };
        let fused: &[&str] = if phi3 { &[] } else { &["attn_qkv.weight"] };
        // qwen3moe's router is its own; a dense MLP in a mixture-of-experts file is not.
        let (unused, dense_in_moe): (&[&str], &[&str]) = match cfg.moe {
            None => (UNUSED, &[]),
            Some(_) => (&UNUSED[..UNUSED.len() - 1], &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]),
        };
        let per_layer = unused.iter().chain(fused).chain(dense_in_moe).map(|s| format!("blk.0.{s}"));
        for name in global.iter().map(|s| s.to_string()).chain(per_layer) {
            if g.has_tensor(&name) {
                let reason = format!("is not supported in a {} model", cfg.arch.name());
                return Err(Error::Tensor { name, reason });
            }
        }
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                let biases = match g.has_tensor(&format!("blk.{i}.attn_q.bias")) {
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
                    Arch::Qwen3 | Arch::Qwen3Moe => {
                        Some([b.vector(g, &n("attn_q_norm"), hd)?, b.vector(g, &n("attn_k_norm"), hd)?])
                    }
                    _ => None,
                };
                // phi3's fused weights, split by rows: Q|K|V in `attn_qkv` (or separate,
                // as llama.cpp also accepts), gate|up in `ffn_up`.
                let [wq, wk, wv] = match g.has_tensor(&n("attn_qkv")) {
                    true => {
                        let (name, all) = (n("attn_qkv"), q + 2 * kv);
                        [0..q, q..q + kv, q + kv..all].map(|r| b.matrix_rows(g, &name, h, all, r))
                    }
                    false => [
                        b.matrix(g, &n("attn_q"), h, q),
                        b.matrix(g, &n("attn_k"), h, kv),
                        b.matrix(g, &n("attn_v"), h, kv),
                    ],
                };
                let ffn = match (cfg.moe, phi3) {
                    (Some(moe), _) => Ffn::Experts(b.experts(g, i, h, moe)?),
                    (None, true) => Ffn::Dense {
                        gate: b.matrix_rows(g, &n("ffn_up"), h, 2 * ff, 0..ff)?,
                        up: b.matrix_rows(g, &n("ffn_up"), h, 2 * ff, ff..2 * ff)?,
                        down: b.matrix(g, &n("ffn_down"), ff, h)?,
                    },
                    (None, false) => Ffn::Dense {
                        gate: b.matrix(g, &n("ffn_gate"), h, ff)?,
                        up: b.matrix(g, &n("ffn_up"), h, ff)?,
                        down: b.matrix(g, &n("ffn_down"), ff, h)?,
                    },
                };
                let (mut wq, mut wk, mut wv) = (wq?, wk?, wv?);
                // Into the matmuls where the backend can; the rest added after them.
                let bias = match biases {
                    None => [None, None, None],
                    Some([bq, bk, bv]) => {
                        [b.attach_bias(&mut wq, bq)?, b.attach_bias(&mut wk, bk)?, b.attach_bias(&mut wv, bv)?]
                    }
                };
                Ok(Layer {
                    attn_norm: b.vector(g, &n("attn_norm"), h)?,
                    wq,
                    wk,
                    wv,
                    bias,
                    qk_norm,
                    wo: b.matrix(g, &n("attn_output"), q, h)?,
                    ffn_norm: b.vector(g, &n("ffn_norm"), h)?,
                    ffn,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let factors = |name: &str| match g.has_tensor(name) {
            true => g.f32_tensor(name, hd / 2).map(Some),
            false => Ok(None),
        };
        let rope_factors = match phi3 {
            true => [factors("rope_factors_short.weight")?, factors("rope_factors_long.weight")?],
            false => {
                let f = factors("rope_freqs.weight")?;
                [f.clone(), f]
            }
        };
        let key = format!("{}.rope.scaling.original_context_length", cfg.arch.name());
        let n_ctx_orig = g.opt_u32(&key).map_or(cfg.ctx_train, |v| v as usize);
        for factors in &rope_factors {
            b.prepare_rope(&Self::angles(cfg, factors.as_deref()))?;
        }
        Ok(Self {
            ends: super::Ends::load(&b, g, cfg)?,
            cfg: cfg.clone(),
            layers,
            rope_factors,
            n_ctx_orig,
            long_context: AtomicBool::new(false),
            b,
        })
    }
}

impl<B: Backend> Architecture for Llama<B> {
    fn set_context(&self, ctx: usize) {
        self.long_context.store(ctx > self.n_ctx_orig, Ordering::Relaxed);
    }

    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let angles =
            Self::angles(c, self.rope_factors[usize::from(self.long_context.load(Ordering::Relaxed))].as_deref());
        // The queries' factor after RoPE: mistral3's attention temperature (each stacked
        // row's own), phi3's 1/√head_dim (llama.cpp scales its queries, then attends at 1).
        let q_scale = match (c.attn_temperature, c.arch) {
            (Some(t), _) => Some(QScale::Temperature(t)),
            (None, Arch::Phi3) => Some(QScale::All(1.0 / (c.head_dim as f32).sqrt())),
            (None, _) => None,
        };
        let mut p = b.begin_scaled(rows, &[angles])?;
        let spec = AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: if c.arch == Arch::Phi3 { 1.0 } else { 1.0 / (c.head_dim as f32).sqrt() },
            window: None,
            sinks: None,
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
            for (x, bias) in [&mut q, &mut k, &mut v].into_iter().zip(&l.bias) {
                if let Some(bias) = bias {
                    b.add_bias(x, bias)?;
                }
            }
            if let Some([nq, nk]) = &l.qk_norm {
                b.rms_norm_inplace(&mut q, nq, c.rms_eps)?;
                b.rms_norm_inplace(&mut k, nk, c.rms_eps)?;
            }
            let o = match &q_scale {
                None => b.rope_attend_matmul(&mut p, rows, il, (&mut q, &mut k, &v), rope, &spec, &l.wo)?,
                Some(s) => {
                    b.rope_qk(&p, (&mut q, &mut k), (rope.q_heads, rope.k_heads), rope.table, rope.style)?;
                    match s {
                        QScale::Temperature(t) => b.temperature(&p, &mut q, *t)?,
                        QScale::All(f) => b.scale(&mut q, *f)?,
                    }
                    b.attend_matmul(&mut p, rows, il, (&q, &k, &v), &spec, &l.wo)?
                }
            };
            ffn_out = Some(match &l.ffn {
                Ffn::Dense { gate, up, down } => {
                    let [g, u] = b.add_norm_matmul_many(&p, &mut x, &o, &l.ffn_norm, c.rms_eps, [gate, up])?;
                    b.gated_matmul(&p, g, &u, Gate::Silu, down)?
                }
                Ffn::Experts(e) => {
                    b.add(&mut x, &o)?;
                    b.moe(&p, &b.rms_norm(&x, &l.ffn_norm, c.rms_eps)?, e)?
                }
            });
        }
        if let Some(y) = ffn_out {
            b.add(&mut x, &y)?;
        }
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
