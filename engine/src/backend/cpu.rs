//! The CPU backend: activations are `Vec<f32>`, ops are `crate::kernels`.

use std::ops::Range;

use super::batch::{Row, Spans, split};
use crate::config::{AttnTemperature, MoeConfig};
use crate::error::Result;
use crate::gguf::Gguf;
use crate::kernels::moe::Experts;
use crate::kernels::rope::{RopeAngles, RopeStyle, RopeTable};
use crate::kernels::{AttnSpec, Embedding, Linear, forward_many};
use crate::kernels::{delta_net, ops};

use super::{Backend, DeltaShape, cpu_hybrid as hybrid};

#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

pub struct CpuPass {
    spans: Spans,
    tokens: Vec<u32>,
    ropes: Vec<RopeTable>,
}

impl CpuPass {
    /// `(first stacked row, tokens, first position)` of each row: a recurrent layer walks
    /// each row's tokens in order against that row's state.
    pub(crate) fn spans(&self) -> &[(usize, usize, usize)] {
        self.spans.each()
    }
}

impl Backend for Cpu {
    type Act = Vec<f32>;
    type Matrix = Linear;
    type Vector = Vec<f32>;
    type Table = Embedding;
    type Pass = CpuPass;
    type Experts = Experts;

    fn matrix(&self, g: &Gguf, name: &str, in_dim: usize, out_dim: usize) -> Result<Linear> {
        Linear::load(g, name, in_dim, out_dim)
    }

    fn matrix_rows(&self, g: &Gguf, name: &str, in_dim: usize, n: usize, rows: Range<usize>) -> Result<Linear> {
        Linear::load_rows(g, name, in_dim, n, rows)
    }

    fn vector(&self, g: &Gguf, name: &str, n: usize) -> Result<Vec<f32>> {
        g.f32_tensor(name, n)
    }

    fn table(&self, g: &Gguf, name: &str, vocab: usize, hidden: usize) -> Result<Embedding> {
        Embedding::load(g, name, vocab, hidden)
    }

    fn experts(&self, g: &Gguf, layer: usize, hidden: usize, moe: MoeConfig) -> Result<Experts> {
        Experts::load(g, layer, hidden, moe)
    }

    fn moe(&self, _: &CpuPass, x: &Vec<f32>, e: &Experts) -> Result<Vec<f32>> {
        e.forward(x)
    }

    fn begin(&self, rows: &mut [Row<'_>], head_dim: usize, rope_bases: &[f32]) -> Result<CpuPass> {
        let spans = Spans::of(rows);
        let tokens = Spans::stack(rows);
        let ropes = rope_bases.iter().map(|&b| spans.rope(head_dim, b)).collect();
        Ok(CpuPass { spans, tokens, ropes })
    }

    fn begin_scaled(&self, rows: &mut [Row<'_>], ropes: &[RopeAngles<'_>]) -> Result<CpuPass> {
        let spans = Spans::of(rows);
        let tokens = Spans::stack(rows);
        let positions = || spans.each().iter().flat_map(|&(_, n, pos0)| pos0..pos0 + n);
        let ropes = ropes.iter().map(|a| RopeTable::scaled(positions(), a)).collect();
        Ok(CpuPass { spans, tokens, ropes })
    }

    fn embed(&self, p: &CpuPass, table: &Embedding) -> Result<Vec<f32>> {
        table.lookup(&p.tokens)
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<()> {
        ops::scale_inplace(x, s);
        Ok(())
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, eps: f32) -> Result<Vec<f32>> {
        Ok(ops::rms_norm(x, w, eps))
    }

    fn rms_norm_inplace(&self, x: &mut Vec<f32>, w: &Vec<f32>, eps: f32) -> Result<()> {
        ops::rms_norm_inplace(x, w, eps);
        Ok(())
    }

    fn matmul(&self, _: &CpuPass, w: &Linear, x: &Vec<f32>) -> Result<Vec<f32>> {
        w.forward(x, x.len() / w.in_dim())
    }

    fn matmul_many<const N: usize>(&self, _: &CpuPass, w: [&Linear; N], x: &Vec<f32>) -> Result<[Vec<f32>; N]> {
        forward_many(w, x, x.len() / w[0].in_dim())
    }

    fn rope(&self, p: &CpuPass, x: &mut Vec<f32>, heads: usize, table: usize, style: RopeStyle) -> Result<()> {
        p.ropes[table].apply(x, heads, style);
        Ok(())
    }

    fn rope_partial(
        &self,
        p: &CpuPass,
        x: &mut Vec<f32>,
        (heads, head_dim): (usize, usize),
        table: usize,
        style: RopeStyle,
    ) -> Result<()> {
        p.ropes[table].apply_partial(x, heads, head_dim, style);
        Ok(())
    }

    fn split_halves(&self, x: &Vec<f32>, half: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok(hybrid::split_halves(x, half))
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>) -> Result<()> {
        hybrid::sigmoid_mul(x, gate);
        Ok(())
    }

    fn ssm_conv(
        &self,
        p: &mut CpuPass,
        rows: &mut [Row<'_>],
        x: &Vec<f32>,
        w: &Vec<f32>,
        s: &DeltaShape,
    ) -> Result<Vec<f32>> {
        hybrid::conv(p.spans(), rows, x, w, s)
    }

    fn l2_norm_heads(&self, x: &mut Vec<f32>, dims: (usize, usize, usize), eps: f32) -> Result<()> {
        delta_net::l2_norm_rows(x, dims, eps);
        Ok(())
    }

    fn delta_gates(&self, beta: &mut Vec<f32>, alpha: &mut Vec<f32>, dt_bias: &Vec<f32>, a: &Vec<f32>) -> Result<()> {
        hybrid::gates(beta, alpha, dt_bias, a);
        Ok(())
    }

    fn delta_rule(
        &self,
        p: &mut CpuPass,
        rows: &mut [Row<'_>],
        x: &Vec<f32>,
        (beta, g): (&Vec<f32>, &Vec<f32>),
        s: &DeltaShape,
    ) -> Result<Vec<f32>> {
        hybrid::delta(p.spans(), rows, x, (beta, g), s)
    }

    fn gated_rms_norm(&self, x: &mut Vec<f32>, w: &Vec<f32>, z: &Vec<f32>, eps: f32) -> Result<()> {
        delta_net::gated_rms_norm(x, w, z, eps);
        Ok(())
    }

    fn attend(
        &self,
        p: &mut CpuPass,
        rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&Vec<f32>, &Vec<f32>, &Vec<f32>),
        spec: &AttnSpec,
    ) -> Result<Vec<f32>> {
        Ok(p.spans.attend(rows, layer, (q, k, v), spec))
    }

    fn silu_mul(&self, g: &mut Vec<f32>, u: &Vec<f32>) -> Result<()> {
        ops::silu_mul(g, u);
        Ok(())
    }

    fn gelu_mul(&self, g: &mut Vec<f32>, u: &Vec<f32>) -> Result<()> {
        ops::gelu_mul(g, u);
        Ok(())
    }

    fn swiglu_oai(&self, g: &mut Vec<f32>, u: &Vec<f32>) -> Result<()> {
        ops::swiglu_oai(g, u);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        ops::add_inplace(x, y);
        Ok(())
    }

    fn add_bias(&self, x: &mut Vec<f32>, b: &Vec<f32>) -> Result<()> {
        ops::add_rows_inplace(x, b);
        Ok(())
    }

    fn temperature(&self, p: &CpuPass, x: &mut Vec<f32>, t: AttnTemperature) -> Result<()> {
        let positions = p.spans.each().iter().flat_map(|&(_, n, pos0)| pos0..pos0 + n);
        let width = x.len() / p.tokens.len().max(1);
        for (row, pos) in x.chunks_exact_mut(width).zip(positions) {
            ops::scale_inplace(row, t.at(pos));
        }
        Ok(())
    }

    fn finish(
        &self,
        p: CpuPass,
        rows: &mut [Row<'_>],
        x: &Vec<f32>,
        norm: &Vec<f32>,
        eps: f32,
        lm_head: &Linear,
    ) -> Result<Vec<Vec<f32>>> {
        p.spans.commit(rows);
        let hidden = norm.len();
        let vocab = lm_head.out_dim();
        let (out, counts) = p.spans.output_rows(rows, x, hidden);
        if out.is_empty() {
            return Ok(split(Vec::new(), &counts, vocab));
        }
        let h = ops::rms_norm(&out, norm, eps);
        Ok(split(lm_head.forward(&h, out.len() / hidden)?, &counts, vocab))
    }
}
