//! qwen35moe's shared expert, as llama.cpp's `qwen35moe` graph adds it after
//! `build_moe_ffn`: a SwiGLU MLP (`ffn_{gate,up,down}_shexp`) that every token runs, its
//! output multiplied by sigmoid(x·`ffn_gate_inp_shexp`) — one f32 logit per token — and
//! that product added to the routed experts' sum (ggml's `mul`, then `add`: the product
//! rounded before the sum).
//!
//! The gate's logit is an f32 matmul of one output row, taken in the router's order (the
//! same ggml op on the same kind of weight); the MLP runs as a dense one does, each row
//! in the one-row arithmetic, so a row's result does not depend on the rows beside it.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, Stored};
use crate::kernels::delta_net::sigmoid;
use crate::kernels::{Linear, forward_many, ops};
use candle_core::quantized::GgmlDType;

pub(super) struct Shared {
    /// `ffn_gate_inp_shexp` (`[hidden]`, f32).
    gate_inp: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Shared {
    /// Layer `layer`'s shared expert, `width` wide.
    pub(super) fn load(g: &Gguf, layer: usize, hidden: usize, width: usize) -> Result<Self> {
        let n = |s: &str| format!("blk.{layer}.{s}.weight");
        let name = n("ffn_gate_inp_shexp");
        let (_, dtype) = g.raw_stored(&name)?;
        if dtype != Stored::Ggml(GgmlDType::F32) {
            let reason = format!("a {dtype:?} shared-expert gate is not supported (f32)");
            return Err(Error::Tensor { name, reason });
        }
        Ok(Self {
            gate_inp: g.f32_tensor(&name, hidden)?,
            gate: Linear::load(g, &n("ffn_gate_shexp"), hidden, width)?,
            up: Linear::load(g, &n("ffn_up_shexp"), hidden, width)?,
            down: Linear::load(g, &n("ffn_down_shexp"), width, hidden)?,
        })
    }

    /// Add the gated shared expert of the normed rows `x` (`[T][hidden]`) to `y`, the
    /// routed experts' output for the same rows.
    pub(super) fn add_to(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let h = self.gate_inp.len();
        let rows = x.len() / h;
        let [mut gate, up] = forward_many([&self.gate, &self.up], x, rows)?;
        ops::silu_mul(&mut gate, &up);
        let out = self.down.forward(&gate, rows)?;
        for ((y, o), x) in y.chunks_exact_mut(h).zip(out.chunks_exact(h)).zip(x.chunks_exact(h)) {
            let s = sigmoid(crate::kernels::attention::dot_lanes(&self.gate_inp, x));
            y.iter_mut().zip(o).for_each(|(y, &o)| *y += o * s);
        }
        Ok(())
    }
}
