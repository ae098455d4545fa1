//! The Gemma 3 architecture: embedding scaled by sqrt(hidden); every block has pre- and
//! post-norms around attention and MLP, RMSNorm on each Q and K head, GeGLU (tanh GELU);
//! five sliding-window layers (window 512, rotary base 10k) per global layer (base 1M);
//! queries scaled by 1/sqrt(head_dim). GGUF norm weights already include Gemma's +1.

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
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: Linear,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    w_gate: Linear,
    w_up: Linear,
    w_down: Linear,
    post_ffn_norm: Vec<f32>,
}

pub(crate) struct Gemma3 {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
}

impl Gemma3 {
    pub(crate) fn load(g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        let embed = Embedding::load(g, "token_embd.weight", cfg.vocab, h)?;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: g.f32_tensor(&n("attn_norm"), h)?,
                    wq: Linear::load(g, &n("attn_q"), h, q)?,
                    wk: Linear::load(g, &n("attn_k"), h, kv)?,
                    wv: Linear::load(g, &n("attn_v"), h, kv)?,
                    q_norm: g.f32_tensor(&n("attn_q_norm"), hd)?,
                    k_norm: g.f32_tensor(&n("attn_k_norm"), hd)?,
                    wo: Linear::load(g, &n("attn_output"), q, h)?,
                    post_attn_norm: g.f32_tensor(&n("post_attention_norm"), h)?,
                    ffn_norm: g.f32_tensor(&n("ffn_norm"), h)?,
                    w_gate: Linear::load(g, &n("ffn_gate"), h, ff)?,
                    w_up: Linear::load(g, &n("ffn_up"), h, ff)?,
                    w_down: Linear::load(g, &n("ffn_down"), ff, h)?,
                    post_ffn_norm: g.f32_tensor(&n("post_ffw_norm"), h)?,
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

impl Architecture for Gemma3 {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.cfg;
        let spans = Spans::of(rows);
        let tokens = Spans::stack(rows);
        let t = spans.total();
        let rope_global = spans.rope(c.head_dim, c.rope_base);
        let rope_local = spans.rope(c.head_dim, c.rope_base_local);
        let spec = |swa: bool| AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            // Q is pre-scaled by 1/sqrt(head_dim) below, as llama.cpp does.
            scale: 1.0,
            window: if swa { c.sliding_window } else { None },
        };
        let q_scale = 1.0 / (c.head_dim as f32).sqrt();
        let mut x = self.embed.lookup(&tokens)?;
        ops::scale_inplace(&mut x, (c.hidden as f32).sqrt());
        for (il, l) in self.layers.iter().enumerate() {
            let swa = c.is_swa[il];
            let rope = if swa { &rope_local } else { &rope_global };
            let h = ops::rms_norm(&x, &l.attn_norm, c.rms_eps);
            let [mut q, mut k, v] = forward_many([&l.wq, &l.wk, &l.wv], &h, t)?;
            ops::rms_norm_inplace(&mut q, &l.q_norm, c.rms_eps);
            ops::rms_norm_inplace(&mut k, &l.k_norm, c.rms_eps);
            rope.apply(&mut q, c.n_heads, RopeStyle::Neox);
            rope.apply(&mut k, c.n_kv_heads, RopeStyle::Neox);
            ops::scale_inplace(&mut q, q_scale);
            let a = spans.attend(rows, il, (&q, &k, &v), &spec(swa));
            let mut o = l.wo.forward(&a, t)?;
            ops::rms_norm_inplace(&mut o, &l.post_attn_norm, c.rms_eps);
            ops::add_inplace(&mut x, &o);

            let h = ops::rms_norm(&x, &l.ffn_norm, c.rms_eps);
            let [mut gate, up] = forward_many([&l.w_gate, &l.w_up], &h, t)?;
            ops::gelu_mul(&mut gate, &up);
            let mut d = l.w_down.forward(&gate, t)?;
            ops::rms_norm_inplace(&mut d, &l.post_ffn_norm, c.rms_eps);
            ops::add_inplace(&mut x, &d);
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
