//! The llama architecture (SmolLM2, Llama 2/3, Mistral-style GQA models):
//! pre-norm blocks, RMSNorm, rotary embedding on interleaved pairs, SwiGLU MLP.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::kernels::ops::{self, RopeStyle};
use crate::kernels::{AttnSpec, Embedding, Linear, forward_many};
use crate::model::Architecture;
use crate::model::batch::{Row, Spans, split};

struct Layer {
    attn_norm: Vec<f32>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    ffn_norm: Vec<f32>,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
}

pub(crate) struct Llama {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
}

impl Llama {
    pub(crate) fn load(g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
        let embed = Embedding::load(g, "token_embd.weight", cfg.vocab, h)?;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: g.f32_tensor(&n("attn_norm"), h)?,
                    wq: Linear::load(g, &n("attn_q"), h, q)?,
                    wk: Linear::load(g, &n("attn_k"), h, kv)?,
                    wv: Linear::load(g, &n("attn_v"), h, kv)?,
                    wo: Linear::load(g, &n("attn_output"), q, h)?,
                    ffn_norm: g.f32_tensor(&n("ffn_norm"), h)?,
                    w_gate: Linear::load(g, &n("ffn_gate"), h, ff)?,
                    w_up: Linear::load(g, &n("ffn_up"), h, ff)?,
                    w_down: Linear::load(g, &n("ffn_down"), ff, h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if g.has_tensor("output.weight") {
            Linear::load(g, "output.weight", h, cfg.vocab)?
        } else {
            embed.to_linear(g, "token_embd.weight")?
        };
        Ok(Self { cfg: cfg.clone(), embed, layers, norm: g.f32_tensor("output_norm.weight", h)?, lm_head })
    }
}

impl Architecture for Llama {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.cfg;
        let spans = Spans::of(rows);
        let tokens = Spans::stack(rows);
        let t = spans.total();
        let rope = spans.rope(c.head_dim, c.rope_base);
        let spec = AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            window: None,
        };
        let mut x = self.embed.lookup(&tokens)?;
        for (il, l) in self.layers.iter().enumerate() {
            let h = ops::rms_norm(&x, &l.attn_norm, c.rms_eps);
            let [mut q, mut k, v] = forward_many([&l.wq, &l.wk, &l.wv], &h, t)?;
            rope.apply(&mut q, c.n_heads, RopeStyle::Interleaved);
            rope.apply(&mut k, c.n_kv_heads, RopeStyle::Interleaved);
            let a = spans.attend(rows, il, (&q, &k, &v), &spec);
            ops::add_inplace(&mut x, &l.wo.forward(&a, t)?);

            let h = ops::rms_norm(&x, &l.ffn_norm, c.rms_eps);
            let [mut gate, up] = forward_many([&l.w_gate, &l.w_up], &h, t)?;
            ops::silu_mul(&mut gate, &up);
            ops::add_inplace(&mut x, &l.w_down.forward(&gate, t)?);
        }
        spans.commit(rows);
        let (out, counts) = spans.output_rows(rows, &x, c.hidden);
        if out.is_empty() {
            return Ok(split(Vec::new(), &counts, c.vocab));
        }
        let h = ops::rms_norm(&out, &self.norm, c.rms_eps);
        Ok(split(self.lm_head.forward(&h, out.len() / c.hidden)?, &counts, c.vocab))
    }
}
