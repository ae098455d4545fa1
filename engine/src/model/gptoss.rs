//! gpt-oss (20b, 120b), as llama.cpp's `openai-moe` graph computes it: pre-norm blocks
//! with RMSNorm; Q/K/V with biases, NeoX rotary pairs under YaRN; attention scaled by
//! 1/√head_dim with a learned sink logit per head (`attn_sinks`, in every softmax's
//! denominator), on even layers over the last `sliding_window` positions only, on odd
//! layers over the whole context; the attention output's own bias; then
//! `post_attention_norm` (despite its name, the FFN's pre-norm) and a mixture of experts
//! (`MoeKind::GptOss`: router bias, top-k then softmax, expert biases, SwiGLU-OAI) in
//! place of every MLP; an output matrix of its own. Written once over `Backend` ops, run
//! by the CPU and the CUDA backends alike.

use crate::backend::batch::Row;
use crate::backend::{Backend, Rotary};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::rope::RopeAngles;
use crate::model::Architecture;

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    /// Q, K and V biases the backend did not take into the matmuls (`attach_bias`).
    bias: [Option<B::Vector>; 3],
    wo: B::Matrix,
    /// The output's bias where the backend did not take it into the matmul.
    wo_bias: Option<B::Vector>,
    /// One logit per query head, read on the host (a backend's kernels take their copy,
    /// made at load by `prepare_sinks`).
    sinks: Vec<f32>,
    /// `post_attention_norm`: the norm before the experts.
    ffn_norm: B::Vector,
    experts: B::Experts,
    /// Whether the layer attends only to the last `sliding_window` positions.
    swa: bool,
}

pub(crate) struct GptOss<B: Backend> {
    b: B,
    cfg: ModelConfig,
    ends: super::Ends<B>,
    layers: Vec<Layer<B>>,
}

impl<B: Backend> GptOss<B> {
    /// The rotary tables of a pass: full-attention layers' (0), sliding-window layers'
    /// (1; the same base unless the file sets `rope.freq_base_swa`). Both take YaRN.
    fn angles(c: &ModelConfig) -> [RopeAngles<'static>; 2] {
        let at = |base| RopeAngles { head_dim: c.head_dim, base, scaling: c.rope_scaling, factors: None };
        [at(c.rope_base), at(c.rope_base_local)]
    }

    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let Some(moe) = cfg.moe else {
            return Err(Error::Metadata { key: "gpt-oss.expert_count".into() });
        };
        // llama.cpp's graph has no place for these: a file with one is refused.
        for name in ["rope_freqs.weight", "blk.0.attn_q_norm.weight", "blk.0.ffn_gate.weight", "blk.0.attn_qkv.weight"]
        {
            if g.has_tensor(name) {
                let reason = "is not supported in a gpt-oss model".into();
                return Err(Error::Tensor { name: name.into(), reason });
            }
        }
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                let nb = |s: &str| format!("blk.{i}.{s}.bias");
                let (mut wq, mut wk, mut wv) = (
                    b.matrix(g, &n("attn_q"), h, q)?,
                    b.matrix(g, &n("attn_k"), h, kv)?,
                    b.matrix(g, &n("attn_v"), h, kv)?,
                );
                let bias = [
                    b.attach_bias(&mut wq, b.vector(g, &nb("attn_q"), q)?)?,
                    b.attach_bias(&mut wk, b.vector(g, &nb("attn_k"), kv)?)?,
                    b.attach_bias(&mut wv, b.vector(g, &nb("attn_v"), kv)?)?,
                ];
                let mut wo = b.matrix(g, &n("attn_output"), q, h)?;
                let wo_bias = b.attach_bias(&mut wo, b.vector(g, &nb("attn_output"), h)?)?;
                let sinks = g.f32_tensor(&n("attn_sinks"), cfg.n_heads)?;
                b.prepare_sinks(&sinks)?;
                Ok(Layer {
                    attn_norm: b.vector(g, &n("attn_norm"), h)?,
                    wq,
                    wk,
                    wv,
                    bias,
                    wo,
                    wo_bias,
                    sinks,
                    ffn_norm: b.vector(g, &n("post_attention_norm"), h)?,
                    experts: b.experts(g, i, h, moe)?,
                    swa: cfg.is_swa[i],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for angles in &Self::angles(cfg) {
            b.prepare_rope(angles)?;
        }
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), layers, b })
    }
}

impl<B: Backend> Architecture for GptOss<B> {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let mut p = b.begin_scaled(rows, &Self::angles(c))?;
        let mut x = b.embed(&p, &self.ends.embed)?;
        // The experts' output, added to `x` together with the next layer's norm.
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
            let spec = AttnSpec {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
                window: if l.swa { c.sliding_window } else { None },
                sinks: Some(&l.sinks),
            };
            let rope = Rotary {
                q_heads: c.n_heads,
                k_heads: c.n_kv_heads,
                table: usize::from(l.swa),
                style: c.arch.rope_style(),
            };
            let mut o = b.rope_attend_matmul(&mut p, rows, il, (&mut q, &mut k, &v), rope, &spec, &l.wo)?;
            if let Some(bias) = &l.wo_bias {
                b.add_bias(&mut o, bias)?;
            }
            b.add(&mut x, &o)?;
            ffn_out = Some(b.moe(&p, &b.rms_norm(&x, &l.ffn_norm, c.rms_eps)?, &l.experts)?);
        }
        if let Some(y) = ffn_out {
            b.add(&mut x, &y)?;
        }
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
