//! Qwen3.5, dense and MoE, as llama.cpp's `qwen35` and `qwen35moe` graphs compute them:
//! pre-norm blocks whose mixer is, on three layers of every four
//! (`HybridConfig::recurrent`), a Gated DeltaNet and otherwise gated full attention, then
//! `post_attention_norm` and a SwiGLU MLP (qwen35) or a mixture of experts with a gated
//! shared expert (qwen35moe: `kernels::moe`, qwen3moe's routing).
//!
//! - Gated DeltaNet: `attn_qkv` and `attn_gate` (z) of the normed input; the Q|K|V
//!   channels through a causal convolution (`ssm_conv1d`, state per sequence) and SiLU;
//!   queries and keys L2-normed per head; β = sigmoid(x·`ssm_beta`), the log decay
//!   g = softplus(x·`ssm_alpha` + `ssm_dt.bias`) · `ssm_a`; the delta rule per value head
//!   (value head `h` reads key head `h % k_heads`, ggml's broadcast); the output RMSNormed
//!   per head (`ssm_norm`) times SiLU(z), then `ssm_out`.
//! - Gated attention: `attn_q` gives each head's query and a gate side by side; Q/K head
//!   RMSNorms; interleaved M-RoPE over the first `n_rot` dimensions, which for text is
//!   NeoX's rotation at the token's position; attention at 1/√head_dim; its output times
//!   sigmoid(gate), then `attn_output`.
//!
//! Written once over `Backend`: the CPU runs it with `kernels::delta_net`'s arithmetic,
//! the GPU with `backend/cuda/kernels/hybrid.cu` (each sequence's recurrent state resident
//! on the device beside its KV mirror; docs/cuda.md). A pass updates each row's recurrent
//! state in place; a pass that fails after the first layer empties its rows' caches
//! (their state would be ahead of their KV), so their next pass recomputes them.

use crate::backend::batch::Row;
use crate::backend::{Backend, DeltaShape, Gate};
use crate::config::{HybridConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::rope::RopeAngles;
use crate::model::Architecture;
use crate::recurrent::RecurrentShape;

struct Attention<B: Backend> {
    /// Each head's query and gate, side by side: `[head][query | gate]`.
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    q_norm: B::Vector,
    k_norm: B::Vector,
    wo: B::Matrix,
    /// This layer's place among the layers with a KV cache.
    kv_layer: usize,
}

struct DeltaNet<B: Backend> {
    /// Q|K|V channels before the convolution.
    wqkv: B::Matrix,
    /// z, the output gate.
    wz: B::Matrix,
    w_beta: B::Matrix,
    w_alpha: B::Matrix,
    /// `[channel][tap]`.
    conv: B::Vector,
    dt_bias: B::Vector,
    /// `-exp(A_log)` per value head.
    a: B::Vector,
    norm: B::Vector,
    out: B::Matrix,
    /// This layer's place among the recurrent layers (its slice of the state).
    slot: usize,
}

enum Mixer<B: Backend> {
    Attention(Attention<B>),
    DeltaNet(DeltaNet<B>),
}

/// A layer's feed-forward part after `post_attention_norm`.
enum Ffn<B: Backend> {
    /// SwiGLU: `down(silu(gate x) * up x)` (qwen35): gate, up, down.
    Dense(Box<[B::Matrix; 3]>),
    /// Routed experts plus the gated shared expert (qwen35moe).
    Experts(Box<B::Experts>),
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    mixer: Mixer<B>,
    post_norm: B::Vector,
    ffn: Ffn<B>,
}

pub(crate) struct Qwen35<B: Backend> {
    b: B,
    cfg: ModelConfig,
    hy: HybridConfig,
    ends: super::Ends<B>,
    layers: Vec<Layer<B>>,
}

/// Tensors llama.cpp's graph would use or that a variant could carry but this one has no
/// place for: a file with one is refused. Then, per family, the other family's FFN.
const UNUSED: &[&str] = &["attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"];
const MOE_ONLY: &[&str] = &["ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"];
const DENSE_ONLY: &[&str] = &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];

impl<B: Backend> Qwen35<B> {
    fn hybrid(cfg: &ModelConfig) -> Result<&HybridConfig> {
        cfg.hybrid.as_ref().ok_or_else(|| Error::Metadata { key: "qwen35.ssm.*".into() })
    }

    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let hy = Self::hybrid(cfg)?.clone();
        let (h, q, kv, ff, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        let (mut kv_layer, mut slot) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let arch = cfg.arch.name();
        let other_ffn = if cfg.moe.is_some() { DENSE_ONLY } else { MOE_ONLY };
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            for name in UNUSED.iter().chain(other_ffn).map(|s| format!("blk.{i}.{s}")) {
                if g.has_tensor(&name) {
                    return Err(Error::Tensor { name, reason: format!("is not supported in a {arch} model") });
                }
            }
            let mixer = if hy.recurrent[i] {
                let (ch, vd, vh) = (hy.conv_channels(), hy.value_dim(), hy.v_heads);
                let m = DeltaNet {
                    wqkv: b.matrix(g, &n("attn_qkv"), h, ch)?,
                    wz: b.matrix(g, &n("attn_gate"), h, vd)?,
                    w_beta: b.matrix(g, &n("ssm_beta"), h, vh)?,
                    w_alpha: b.matrix(g, &n("ssm_alpha"), h, vh)?,
                    conv: b.vector(g, &n("ssm_conv1d"), ch * hy.conv_kernel)?,
                    dt_bias: b.vector(g, &format!("blk.{i}.ssm_dt.bias"), vh)?,
                    a: b.vector(g, &format!("blk.{i}.ssm_a"), vh)?,
                    norm: b.vector(g, &n("ssm_norm"), hy.head_dim)?,
                    out: b.matrix(g, &n("ssm_out"), vd, h)?,
                    slot,
                };
                slot += 1;
                Mixer::DeltaNet(m)
            } else {
                if g.has_tensor(&n("attn_qkv")) {
                    let reason = format!("(fused Q/K/V in an attention layer) is not supported in a {arch} model");
                    return Err(Error::Tensor { name: n("attn_qkv"), reason });
                }
                let m = Attention {
                    wq: b.matrix(g, &n("attn_q"), h, 2 * q)?,
                    wk: b.matrix(g, &n("attn_k"), h, kv)?,
                    wv: b.matrix(g, &n("attn_v"), h, kv)?,
                    q_norm: b.vector(g, &n("attn_q_norm"), hd)?,
                    k_norm: b.vector(g, &n("attn_k_norm"), hd)?,
                    wo: b.matrix(g, &n("attn_output"), q, h)?,
                    kv_layer,
                };
                kv_layer += 1;
                Mixer::Attention(m)
            };
            let ffn = match cfg.moe {
                Some(moe) => Ffn::Experts(Box::new(b.experts(g, i, h, moe)?)),
                None => Ffn::Dense(Box::new([
                    b.matrix(g, &n("ffn_gate"), h, ff)?,
                    b.matrix(g, &n("ffn_up"), h, ff)?,
                    b.matrix(g, &n("ffn_down"), ff, h)?,
                ])),
            };
            layers.push(Layer {
                attn_norm: b.vector(g, &n("attn_norm"), h)?,
                mixer,
                post_norm: b.vector(g, &n("post_attention_norm"), h)?,
                ffn,
            });
        }
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), hy, layers, b })
    }

    fn state_shape(&self) -> RecurrentShape {
        RecurrentShape { layers: self.hy.recurrent_layers(), conv: self.hy.conv_state(), ssm: self.hy.ssm_state() }
    }

    /// The layers, from the embeddings to the last hidden state.
    fn blocks(&self, p: &mut B::Pass, rows: &mut [Row<'_>], mut x: B::Act) -> Result<B::Act> {
        let (b, c) = (&self.b, &self.cfg);
        for l in &self.layers {
            let h = b.rms_norm(&x, &l.attn_norm, c.rms_eps)?;
            let o = match &l.mixer {
                Mixer::Attention(a) => self.attention(p, rows, a, &h)?,
                Mixer::DeltaNet(d) => self.delta_net(p, rows, d, &h)?,
            };
            b.add(&mut x, &o)?;
            let y = match &l.ffn {
                Ffn::Dense(m) => {
                    let [gate, up, down] = &**m;
                    let [g, u] = b.norm_matmul_many(p, &x, &l.post_norm, c.rms_eps, [gate, up])?;
                    b.gated_matmul(p, g, &u, Gate::Silu, down)?
                }
                Ffn::Experts(e) => b.moe(p, &b.rms_norm(&x, &l.post_norm, c.rms_eps)?, e)?,
            };
            b.add(&mut x, &y)?;
        }
        Ok(x)
    }

    fn attention(&self, p: &mut B::Pass, rows: &mut [Row<'_>], a: &Attention<B>, h: &B::Act) -> Result<B::Act> {
        let (b, c) = (&self.b, &self.cfg);
        let (hd, heads) = (c.head_dim, c.n_heads);
        let [qg, mut k, v] = b.matmul_many(p, [&a.wq, &a.wk, &a.wv], h)?;
        let (mut q, gate) = b.split_halves(&qg, hd)?;
        b.rms_norm_inplace(&mut q, &a.q_norm, c.rms_eps)?;
        b.rms_norm_inplace(&mut k, &a.k_norm, c.rms_eps)?;
        b.rope_partial(p, &mut q, (heads, hd), 0, c.arch.rope_style())?;
        b.rope_partial(p, &mut k, (c.n_kv_heads, hd), 0, c.arch.rope_style())?;
        let spec = AttnSpec {
            n_heads: heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            sinks: None,
        };
        let mut o = b.attend(p, rows, a.kv_layer, (&q, &k, &v), &spec)?;
        b.sigmoid_mul(&mut o, &gate)?;
        b.matmul(p, &a.wo, &o)
    }

    fn delta_net(&self, p: &mut B::Pass, rows: &mut [Row<'_>], d: &DeltaNet<B>, h: &B::Act) -> Result<B::Act> {
        let (b, hy, eps) = (&self.b, &self.hy, self.cfg.rms_eps);
        let s = DeltaShape {
            state: self.state_shape(),
            slot: d.slot,
            k_heads: hy.k_heads,
            v_heads: hy.v_heads,
            head_dim: hy.head_dim,
            taps: hy.conv_kernel,
        };
        let [qkv, z, mut beta, mut alpha] = b.matmul_many(p, [&d.wqkv, &d.wz, &d.w_beta, &d.w_alpha], h)?;
        b.delta_gates(&mut beta, &mut alpha, &d.dt_bias, &d.a)?;
        let mut x = b.ssm_conv(p, rows, &qkv, &d.conv, &s)?;
        b.l2_norm_heads(&mut x, (s.channels(), 2 * s.key_dim(), s.head_dim), eps)?;
        let mut out = b.delta_rule(p, rows, &x, (&beta, &alpha), &s)?;
        b.gated_rms_norm(&mut out, &d.norm, &z, eps)?;
        b.matmul(p, &d.out, &out)
    }
}

impl<B: Backend> Architecture for Qwen35<B> {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let shape = self.state_shape();
        if !rows.iter_mut().all(|r| r.cache.ensure_recurrent(shape)) {
            return Err(crate::backend::missing_state());
        }
        let angles = RopeAngles { head_dim: self.hy.n_rot, base: c.rope_base, scaling: c.rope_scaling, factors: None };
        let mut p = b.begin_partial(rows, c.head_dim, &[angles])?;
        let x = b.embed(&p, &self.ends.embed)?;
        let x = match self.blocks(&mut p, rows, x) {
            Ok(x) => x,
            Err(e) => {
                rows.iter_mut().for_each(|r| r.cache.clear());
                return Err(e);
            }
        };
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
