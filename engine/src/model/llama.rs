//! The llama architecture (SmolLM2, Llama 2/3, Mistral-style GQA models):
//! pre-norm blocks, RMSNorm, rotary embedding on interleaved pairs, SwiGLU MLP.
//! Written once over `Backend` ops; runs on the CPU or a GPU.

use crate::backend::batch::Row;
use crate::backend::{Backend, Gate, Rotary};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::ops::RopeStyle;
use crate::model::Architecture;

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
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
}

impl<B: Backend> Llama<B> {
    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: b.vector(g, &n("attn_norm"), h)?,
                    wq: b.matrix(g, &n("attn_q"), h, q)?,
                    wk: b.matrix(g, &n("attn_k"), h, kv)?,
                    wv: b.matrix(g, &n("attn_v"), h, kv)?,
                    wo: b.matrix(g, &n("attn_output"), q, h)?,
                    ffn_norm: b.vector(g, &n("ffn_norm"), h)?,
                    w_gate: b.matrix(g, &n("ffn_gate"), h, ff)?,
                    w_up: b.matrix(g, &n("ffn_up"), h, ff)?,
                    w_down: b.matrix(g, &n("ffn_down"), ff, h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), layers, b })
    }
}

impl<B: Backend> Architecture for Llama<B> {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let mut p = b.begin(rows, c.head_dim, &[c.rope_base])?;
        let spec = AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            window: None,
        };
        let rope = Rotary { q_heads: c.n_heads, k_heads: c.n_kv_heads, table: 0, style: RopeStyle::Interleaved };
        let mut x = b.embed(&p, &self.ends.embed)?;
        // The FFN's output, added to `x` together with the next layer's norm.
        let mut ffn_out = None;
        for (il, l) in self.layers.iter().enumerate() {
            let qkv = [&l.wq, &l.wk, &l.wv];
            let [mut q, mut k, v] = match ffn_out.take() {
                Some(y) => b.add_norm_matmul_many(&p, &mut x, &y, &l.attn_norm, c.rms_eps, qkv)?,
                None => b.norm_matmul_many(&p, &x, &l.attn_norm, c.rms_eps, qkv)?,
            };
            let o = b.rope_attend_matmul(&mut p, rows, il, (&mut q, &mut k, &v), rope, &spec, &l.wo)?;
            let [gate, up] = b.add_norm_matmul_many(&p, &mut x, &o, &l.ffn_norm, c.rms_eps, [&l.w_gate, &l.w_up])?;
            ffn_out = Some(b.gated_matmul(&p, gate, &up, Gate::Silu, &l.w_down)?);
        }
        if let Some(y) = ffn_out {
            b.add(&mut x, &y)?;
        }
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
