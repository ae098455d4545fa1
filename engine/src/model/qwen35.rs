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
//! CPU only: written over the CPU backend's ops and `kernels::delta_net`, not over every
//! backend (the CUDA one has no recurrent layers; `ModelConfig::no_gpu_path` keeps the
//! model off it and `--device cuda:N` refuses it). A pass updates each row's recurrent
//! state in place; a pass that fails after the first layer empties its rows' caches
//! (their state would be ahead of their KV), so their next pass recomputes them.

use crate::backend::batch::Row;
use crate::backend::cpu::{Cpu, CpuPass};
use crate::backend::{Backend, Gate};
use crate::config::{HybridConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::delta_net::{DeltaStep, conv_step, delta_step, l2_norm_heads, sigmoid, silu_rows, softplus};
use crate::kernels::moe::Experts;
use crate::kernels::ops;
use crate::kernels::rope::RopeAngles;
use crate::kernels::{AttnSpec, Linear};
use crate::model::Architecture;
use crate::recurrent::RecurrentShape;

struct Attention {
    /// Each head's query and gate, side by side: `[head][query | gate]`.
    wq: Linear,
    wk: Linear,
    wv: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: Linear,
    /// This layer's place among the layers with a KV cache.
    kv_layer: usize,
}

struct DeltaNet {
    /// Q|K|V channels before the convolution.
    wqkv: Linear,
    /// z, the output gate.
    wz: Linear,
    w_beta: Linear,
    w_alpha: Linear,
    /// `[channel][tap]`.
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `-exp(A_log)` per value head.
    a: Vec<f32>,
    norm: Vec<f32>,
    out: Linear,
    /// This layer's place among the recurrent layers (its slice of the state).
    slot: usize,
}

enum Mixer {
    Attention(Attention),
    DeltaNet(DeltaNet),
}

/// A layer's feed-forward part after `post_attention_norm`.
enum Ffn {
    /// SwiGLU: `down(silu(gate x) * up x)` (qwen35): gate, up, down.
    Dense(Box<[Linear; 3]>),
    /// Routed experts plus the gated shared expert (qwen35moe).
    Experts(Box<Experts>),
}

struct Layer {
    attn_norm: Vec<f32>,
    mixer: Mixer,
    post_norm: Vec<f32>,
    ffn: Ffn,
}

pub(crate) struct Qwen35 {
    cfg: ModelConfig,
    hy: HybridConfig,
    ends: super::Ends<Cpu>,
    layers: Vec<Layer>,
}

/// Tensors llama.cpp's graph would use or that a variant could carry but this one has no
/// place for: a file with one is refused. Then, per family, the other family's FFN.
const UNUSED: &[&str] = &["attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"];
const MOE_ONLY: &[&str] = &["ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"];
const DENSE_ONLY: &[&str] = &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];

impl Qwen35 {
    fn hybrid(cfg: &ModelConfig) -> Result<&HybridConfig> {
        cfg.hybrid.as_ref().ok_or_else(|| Error::Metadata { key: "qwen35.ssm.*".into() })
    }

    pub(crate) fn load(g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let b = Cpu;
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
                    conv: g.f32_tensor(&n("ssm_conv1d"), ch * hy.conv_kernel)?,
                    dt_bias: g.f32_tensor(&format!("blk.{i}.ssm_dt.bias"), vh)?,
                    a: g.f32_tensor(&format!("blk.{i}.ssm_a"), vh)?,
                    norm: g.f32_tensor(&n("ssm_norm"), hy.head_dim)?,
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
                    q_norm: g.f32_tensor(&n("attn_q_norm"), hd)?,
                    k_norm: g.f32_tensor(&n("attn_k_norm"), hd)?,
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
                attn_norm: g.f32_tensor(&n("attn_norm"), h)?,
                mixer,
                post_norm: g.f32_tensor(&n("post_attention_norm"), h)?,
                ffn,
            });
        }
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), hy, layers })
    }

    fn state_shape(&self) -> RecurrentShape {
        RecurrentShape { layers: self.hy.recurrent_layers(), conv: self.hy.conv_state(), ssm: self.hy.ssm_state() }
    }

    /// The layers, from the embeddings to the last hidden state.
    fn blocks(&self, p: &mut CpuPass, rows: &mut [Row<'_>], mut x: Vec<f32>) -> Result<Vec<f32>> {
        let (b, c) = (Cpu, &self.cfg);
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

    fn attention(&self, p: &mut CpuPass, rows: &mut [Row<'_>], a: &Attention, h: &Vec<f32>) -> Result<Vec<f32>> {
        let (b, c) = (Cpu, &self.cfg);
        let (hd, heads) = (c.head_dim, c.n_heads);
        let [qg, mut k, v] = b.matmul_many(p, [&a.wq, &a.wk, &a.wv], h)?;
        let (mut q, mut gate) = (Vec::with_capacity(qg.len() / 2), Vec::with_capacity(qg.len() / 2));
        for head in qg.chunks_exact(2 * hd) {
            q.extend_from_slice(&head[..hd]);
            gate.extend_from_slice(&head[hd..]);
        }
        b.rms_norm_inplace(&mut q, &a.q_norm, c.rms_eps)?;
        b.rms_norm_inplace(&mut k, &a.k_norm, c.rms_eps)?;
        let table = p.rope_table(0);
        table.apply_partial(&mut q, heads, hd, c.arch.rope_style());
        table.apply_partial(&mut k, c.n_kv_heads, hd, c.arch.rope_style());
        let spec = AttnSpec {
            n_heads: heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            sinks: None,
        };
        let mut o = b.attend(p, rows, a.kv_layer, (&q, &k, &v), &spec)?;
        for (o, g) in o.iter_mut().zip(&gate) {
            *o *= sigmoid(*g);
        }
        b.matmul(p, &a.wo, &o)
    }

    fn delta_net(&self, p: &mut CpuPass, rows: &mut [Row<'_>], d: &DeltaNet, h: &Vec<f32>) -> Result<Vec<f32>> {
        let (b, hy, eps) = (Cpu, &self.hy, self.cfg.rms_eps);
        let (ch, kd, vd, vh, dh) = (hy.conv_channels(), hy.key_dim(), hy.value_dim(), hy.v_heads, hy.head_dim);
        let [qkv, mut z] = b.matmul_many(p, [&d.wqkv, &d.wz], h)?;
        let [beta, alpha] = b.matmul_many(p, [&d.w_beta, &d.w_alpha], h)?;
        let beta: Vec<f32> = beta.iter().map(|&x| sigmoid(x)).collect();
        let decay: Vec<f32> = alpha
            .chunks_exact(vh)
            .flat_map(|r| r.iter().zip(&d.dt_bias).zip(&d.a).map(|((x, b), a)| softplus(x + b) * a))
            .collect();
        let mut out = vec![0.0f32; vd * qkv.len() / ch];
        let shape = self.state_shape();
        for (r, &(at, n, _)) in rows.iter_mut().zip(p.spans()) {
            let state = r.cache.recurrent_mut(shape).ok_or_else(missing_state)?;
            let (conv_state, ssm) = state.layer_mut(d.slot);
            for t in at..at + n {
                let mut x = conv_step(conv_state, &d.conv, &qkv[t * ch..(t + 1) * ch], hy.conv_kernel);
                silu_rows(&mut x, ch);
                let (qk, v) = x.split_at_mut(2 * kd);
                let (q, k) = qk.split_at_mut(kd);
                l2_norm_heads(q, dh, eps);
                l2_norm_heads(k, dh, eps);
                let o = &mut out[t * vd..(t + 1) * vd];
                for (head, (s, o)) in ssm.chunks_exact_mut(dh * dh).zip(o.chunks_exact_mut(dh)).enumerate() {
                    let kh = (head % hy.k_heads) * dh;
                    let step = DeltaStep {
                        q: &q[kh..kh + dh],
                        k: &k[kh..kh + dh],
                        v: &v[head * dh..(head + 1) * dh],
                        g: decay[t * vh + head],
                        beta: beta[t * vh + head],
                    };
                    delta_step(s, &step, o);
                }
            }
        }
        ops::rms_norm_inplace(&mut out, &d.norm, eps);
        silu_rows(&mut z, dh);
        for (o, z) in out.iter_mut().zip(&z) {
            *o *= z;
        }
        b.matmul(p, &d.out, &out)
    }
}

fn missing_state() -> Error {
    Error::Tensor {
        name: "recurrent state".into(),
        reason: "a hybrid (qwen35) sequence with cached positions but no recurrent state cannot continue".into(),
    }
}

impl Architecture for Qwen35 {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (Cpu, &self.cfg);
        let shape = self.state_shape();
        if rows.iter_mut().any(|r| r.cache.recurrent_mut(shape).is_none()) {
            return Err(missing_state());
        }
        let angles = RopeAngles { head_dim: self.hy.n_rot, base: c.rope_base, scaling: c.rope_scaling, factors: None };
        let mut p = b.begin_scaled(rows, &[angles])?;
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
