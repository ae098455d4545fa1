//! The Gemma 3 architecture: embedding scaled by sqrt(hidden); every block has pre- and
//! post-norms around attention and MLP, RMSNorm on each Q and K head, GeGLU (tanh GELU);
//! five sliding-window layers (window 512, rotary base 10k) per global layer (base 1M);
//! queries scaled by 1/sqrt(head_dim). GGUF norm weights already include Gemma's +1.
//! Written once over `Backend` ops; runs on the CPU or a GPU.

use crate::backend::batch::Row;
use crate::backend::{Backend, Gate};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::rope::RopeStyle;
use crate::model::Architecture;

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    q_norm: B::Vector,
    k_norm: B::Vector,
    wo: B::Matrix,
    post_attn_norm: B::Vector,
    ffn_norm: B::Vector,
    w_gate: B::Matrix,
    w_up: B::Matrix,
    w_down: B::Matrix,
    post_ffn_norm: B::Vector,
}

pub(crate) struct Gemma3<B: Backend> {
    b: B,
    cfg: ModelConfig,
    ends: super::Ends<B>,
    layers: Vec<Layer<B>>,
}

/// Rotary tables of a pass: global layers', then sliding-window layers'.
const GLOBAL: usize = 0;
const LOCAL: usize = 1;

impl<B: Backend> Gemma3<B> {
    pub(crate) fn load(b: B, g: &Gguf, cfg: &ModelConfig) -> Result<Self> {
        let (h, q, kv, ff, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: b.vector(g, &n("attn_norm"), h)?,
                    wq: b.matrix(g, &n("attn_q"), h, q)?,
                    wk: b.matrix(g, &n("attn_k"), h, kv)?,
                    wv: b.matrix(g, &n("attn_v"), h, kv)?,
                    q_norm: b.vector(g, &n("attn_q_norm"), hd)?,
                    k_norm: b.vector(g, &n("attn_k_norm"), hd)?,
                    wo: b.matrix(g, &n("attn_output"), q, h)?,
                    post_attn_norm: b.vector(g, &n("post_attention_norm"), h)?,
                    ffn_norm: b.vector(g, &n("ffn_norm"), h)?,
                    w_gate: b.matrix(g, &n("ffn_gate"), h, ff)?,
                    w_up: b.matrix(g, &n("ffn_up"), h, ff)?,
                    w_down: b.matrix(g, &n("ffn_down"), ff, h)?,
                    post_ffn_norm: b.vector(g, &n("post_ffw_norm"), h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { ends: super::Ends::load(&b, g, cfg)?, cfg: cfg.clone(), layers, b })
    }
}

impl<B: Backend> Architecture for Gemma3<B> {
    fn forward(&self, rows: &mut [Row<'_>]) -> Result<Vec<Vec<f32>>> {
        let (b, c) = (&self.b, &self.cfg);
        let mut p = b.begin(rows, c.head_dim, &[c.rope_base, c.rope_base_local])?;
        let spec = |swa: bool| AttnSpec {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            // Q is pre-scaled by 1/sqrt(head_dim) below, as llama.cpp does.
            scale: 1.0,
            window: if swa { c.sliding_window } else { None },
            sinks: None,
        };
        let q_scale = 1.0 / (c.head_dim as f32).sqrt();
        let mut x = b.embed(&p, &self.ends.embed)?;
        b.scale(&mut x, (c.hidden as f32).sqrt())?;
        // The FFN's output, added to `x` together with the next layer's norm.
        let mut ffn_out = None;
        for (il, l) in self.layers.iter().enumerate() {
            let swa = c.is_swa[il];
            let rope = if swa { LOCAL } else { GLOBAL };
            let qkv = [&l.wq, &l.wk, &l.wv];
            let [mut q, mut k, v] = match ffn_out.take() {
                Some(y) => b.add_norm_matmul_many(&p, &mut x, &y, &l.attn_norm, c.rms_eps, qkv)?,
                None => b.norm_matmul_many(&p, &x, &l.attn_norm, c.rms_eps, qkv)?,
            };
            b.rms_norm_inplace(&mut q, &l.q_norm, c.rms_eps)?;
            b.rms_norm_inplace(&mut k, &l.k_norm, c.rms_eps)?;
            b.rope_qk(&p, (&mut q, &mut k), (c.n_heads, c.n_kv_heads), rope, RopeStyle::Neox)?;
            b.scale(&mut q, q_scale)?;
            let mut o = b.attend_matmul(&mut p, rows, il, (&q, &k, &v), &spec(swa), &l.wo)?;
            b.rms_norm_inplace(&mut o, &l.post_attn_norm, c.rms_eps)?;
            let [gate, up] = b.add_norm_matmul_many(&p, &mut x, &o, &l.ffn_norm, c.rms_eps, [&l.w_gate, &l.w_up])?;
            let mut d = b.gated_matmul(&p, gate, &up, Gate::Gelu, &l.w_down)?;
            b.rms_norm_inplace(&mut d, &l.post_ffn_norm, c.rms_eps)?;
            ffn_out = Some(d);
        }
        if let Some(y) = ffn_out {
            b.add(&mut x, &y)?;
        }
        b.finish(p, rows, &x, &self.ends.norm, c.rms_eps, &self.ends.lm_head)
    }
}
