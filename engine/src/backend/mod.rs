//! Compute backends: the small set of ops every architecture's forward is written over
//! (`crate::model::{llama, gemma3}` are generic over `Backend`), executed by the CPU
//! kernels (`cpu`) or an NVIDIA GPU (`cuda`). A batch of rows is the unit a backend
//! executes; one forward pass is `begin` .. ops .. `finish`.
//!
//! Activations live in the backend's memory (`Act`); only token ids go in and only the
//! requested logits come out. The CPU backend calls exactly the kernels the model called
//! before this seam existed, so CPU numerics (and the llama.cpp parity) are unchanged.

pub mod batch;
pub mod cpu;
mod cpu_hybrid;
pub mod cuda;
mod device;

pub use cpu_hybrid::missing_state;
pub use device::{DeviceChoice, DeviceKind};

use std::ops::Range;

use crate::config::{AttnTemperature, MoeConfig};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::kernels::AttnSpec;
use crate::kernels::rope::{RopeAngles, RopeScaling, RopeStyle};
use crate::recurrent::RecurrentShape;
use batch::Row;

/// The gated activation of an MLP: `gate(g) * u`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU (llama).
    Silu,
    /// GeGLU, tanh form (gemma).
    Gelu,
    /// gpt-oss's SwiGLU-OAI (`kernels::ops::swiglu_oai`: the gate capped at 7, the up
    /// value clamped to ±7, α 1.702, `(u + 1)`), its experts' activation.
    SwigluOai,
}

/// The rotary embedding of a layer's queries and keys: head counts, which of the
/// pass's rotary tables, and the pairing.
#[derive(Clone, Copy, Debug)]
pub struct Rotary {
    pub q_heads: usize,
    pub k_heads: usize,
    pub table: usize,
    pub style: RopeStyle,
}

/// A Gated DeltaNet layer (qwen35): its heads, its convolution's taps, and its place
/// (`slot`) among the recurrent layers of each row's state (`RecurrentShape`).
#[derive(Clone, Copy, Debug)]
pub struct DeltaShape {
    pub state: RecurrentShape,
    pub slot: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
    pub taps: usize,
}

impl DeltaShape {
    /// Q|K|V channels of the convolution.
    pub fn channels(&self) -> usize {
        (2 * self.k_heads + self.v_heads) * self.head_dim
    }

    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }
}

pub trait Backend: Send + Sync + 'static {
    /// Activations `[rows][width]` for the pass's stacked rows.
    type Act;
    /// A weight matrix `[out][in]` in its stored (quantized) format.
    type Matrix: Send + Sync;
    /// A vector of f32 weights (norms).
    type Vector: Send + Sync;
    /// The token embedding table.
    type Table: Send + Sync;
    /// What one forward pass needs to know about its rows (positions, rotary tables,
    /// where each row's K/V lives).
    type Pass;
    /// One layer's mixture of experts: its router and every expert's matrices (qwen3moe).
    type Experts: Send + Sync;

    fn matrix(&self, g: &Gguf, name: &str, in_dim: usize, out_dim: usize) -> Result<Self::Matrix>;
    /// Rows `rows` of `name`, an `[n, in_dim]` matrix, as a matrix of their own: the parts
    /// of a fused weight (phi3).
    fn matrix_rows(&self, g: &Gguf, name: &str, in_dim: usize, n: usize, rows: Range<usize>) -> Result<Self::Matrix>;
    fn vector(&self, g: &Gguf, name: &str, n: usize) -> Result<Self::Vector>;
    fn table(&self, g: &Gguf, name: &str, vocab: usize, hidden: usize) -> Result<Self::Table>;
    /// Layer `layer`'s router (`ffn_gate_inp`) and experts (`ffn_{gate,up,down}_exps`).
    /// A backend without a mixture-of-experts op says so here, at load.
    fn experts(&self, g: &Gguf, layer: usize, hidden: usize, moe: MoeConfig) -> Result<Self::Experts>;

    /// Start a pass over `rows` (each row's tokens at positions `cache.len()..`), with
    /// rotary tables for each of `rope_bases` (`rope` picks one by index).
    fn begin(&self, rows: &mut [Row<'_>], head_dim: usize, rope_bases: &[f32]) -> Result<Self::Pass>;
    /// Make a rotary table ready before any pass uses it (the CUDA backend uploads a
    /// scaled table's terms here, so a decode step captured as a graph — which cannot
    /// upload — finds them even when a model's first pass is a single token).
    fn prepare_rope(&self, _angles: &RopeAngles<'_>) -> Result<()> {
        Ok(())
    }
    /// Make a layer's attention sinks (`AttnSpec::sinks`) ready before any pass uses them
    /// (the CUDA backend uploads them here, for the reason `prepare_rope` gives).
    fn prepare_sinks(&self, _sinks: &[f32]) -> Result<()> {
        Ok(())
    }
    /// `begin` with rotary tables that may be scaled or carry frequency factors (Llama 3's
    /// `rope_freqs`, `rope.scaling.*`). A backend without such tables runs only plain ones.
    fn begin_scaled(&self, rows: &mut [Row<'_>], ropes: &[RopeAngles<'_>]) -> Result<Self::Pass> {
        if let Some(r) = ropes.iter().find(|r| r.scaling != RopeScaling::NONE || r.factors.is_some()) {
            return Err(Error::Tensor {
                name: "rope_freqs".into(),
                reason: format!("this backend has no scaled rotary tables ({:?})", r.scaling),
            });
        }
        let head_dim = ropes.first().map_or(0, |r| r.head_dim);
        let bases: Vec<f32> = ropes.iter().map(|r| r.base).collect();
        self.begin(rows, head_dim, &bases)
    }
    /// `begin_scaled` for a model whose attention heads (`attn_head_dim` wide: how the
    /// GPU plans its attention) are wider than the rotated part (`ropes`' head size,
    /// `rope_partial`).
    fn begin_partial(
        &self,
        rows: &mut [Row<'_>],
        _attn_head_dim: usize,
        ropes: &[RopeAngles<'_>],
    ) -> Result<Self::Pass> {
        self.begin_scaled(rows, ropes)
    }
    /// The stacked rows' embeddings `[T][hidden]`.
    fn embed(&self, p: &Self::Pass, table: &Self::Table) -> Result<Self::Act>;
    fn scale(&self, x: &mut Self::Act, s: f32) -> Result<()>;
    /// RMSNorm of each run of `w`'s length (rows, or heads within rows).
    fn rms_norm(&self, x: &Self::Act, w: &Self::Vector, eps: f32) -> Result<Self::Act>;
    fn rms_norm_inplace(&self, x: &mut Self::Act, w: &Self::Vector, eps: f32) -> Result<()>;
    /// `x W^T` for the pass's stacked rows (a backend may pick its arithmetic per row's
    /// sequence chunk, never by the rows it is batched with).
    fn matmul(&self, p: &Self::Pass, w: &Self::Matrix, x: &Self::Act) -> Result<Self::Act>;
    /// Several matrices of the same input width against one `x`.
    fn matmul_many<const N: usize>(
        &self,
        p: &Self::Pass,
        w: [&Self::Matrix; N],
        x: &Self::Act,
    ) -> Result<[Self::Act; N]>;
    /// `matmul_many` of `rms_norm(x, norm, eps)`; a backend may fuse the norm into the
    /// quantization of the matmul's input (the values must be the unfused ones).
    fn norm_matmul_many<const N: usize>(
        &self,
        p: &Self::Pass,
        x: &Self::Act,
        norm: &Self::Vector,
        eps: f32,
        w: [&Self::Matrix; N],
    ) -> Result<[Self::Act; N]> {
        let h = self.rms_norm(x, norm, eps)?;
        self.matmul_many(p, w, &h)
    }
    /// `x += y`, then `norm_matmul_many` of the new `x` (a backend may do the add, the
    /// norm and the quantization in one kernel; the values must be the unfused ones).
    fn add_norm_matmul_many<const N: usize>(
        &self,
        p: &Self::Pass,
        x: &mut Self::Act,
        y: &Self::Act,
        norm: &Self::Vector,
        eps: f32,
        w: [&Self::Matrix; N],
    ) -> Result<[Self::Act; N]> {
        self.add(x, y)?;
        self.norm_matmul_many(p, x, norm, eps, w)
    }
    /// `matmul` of `gate(g) * u` (fusable likewise).
    fn gated_matmul(
        &self,
        p: &Self::Pass,
        mut g: Self::Act,
        u: &Self::Act,
        gate: Gate,
        w: &Self::Matrix,
    ) -> Result<Self::Act> {
        match gate {
            Gate::Silu => self.silu_mul(&mut g, u)?,
            Gate::Gelu => self.gelu_mul(&mut g, u)?,
            Gate::SwigluOai => self.swiglu_oai(&mut g, u)?,
        }
        self.matmul(p, w, &g)
    }
    /// Rotate `x` (`[T][heads][head_dim]`) by rotary table `table` of the pass.
    fn rope(&self, p: &Self::Pass, x: &mut Self::Act, heads: usize, table: usize, style: RopeStyle) -> Result<()>;
    /// `rope` of the queries and of the keys (one launch on a GPU).
    fn rope_qk(
        &self,
        p: &Self::Pass,
        (q, k): (&mut Self::Act, &mut Self::Act),
        (q_heads, k_heads): (usize, usize),
        table: usize,
        style: RopeStyle,
    ) -> Result<()> {
        self.rope(p, q, q_heads, table, style)?;
        self.rope(p, k, k_heads, table, style)
    }
    /// Rotate the first dimensions (the table's head size) of each `head_dim`-wide head
    /// of `x` (`[T][heads][head_dim]`; `heads_dim` is `(heads, head_dim)`) by rotary table `table` (qwen35's partial M-RoPE,
    /// for text a plain rotation at the token's position).
    fn rope_partial(
        &self,
        p: &Self::Pass,
        x: &mut Self::Act,
        heads_dim: (usize, usize),
        table: usize,
        style: RopeStyle,
    ) -> Result<()>;
    /// `[T][heads][2 * half]` split into each head's first and second halves, each
    /// `[T][heads][half]` (qwen35's queries and their gates).
    fn split_halves(&self, x: &Self::Act, half: usize) -> Result<(Self::Act, Self::Act)>;
    /// `x *= sigmoid(gate)` element by element (qwen35's gated attention output).
    fn sigmoid_mul(&self, x: &mut Self::Act, gate: &Self::Act) -> Result<()>;
    /// The causal convolution of each row's tokens in order (`x`: `[T][channels]`),
    /// through and into that row's convolution state of layer `s.slot`, then SiLU.
    fn ssm_conv(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        x: &Self::Act,
        w: &Self::Vector,
        s: &DeltaShape,
    ) -> Result<Self::Act>;
    /// The L2 norm of each `head`-wide head among the first `n` values of every
    /// `width`-wide row of `x` (`dims` is `(width, n, head)`) (`kernels::delta_net::l2_norm_heads`).
    fn l2_norm_heads(&self, x: &mut Self::Act, dims: (usize, usize, usize), eps: f32) -> Result<()>;
    /// The delta rule's gates in place: `beta = sigmoid(beta)`, and the log decay
    /// `alpha = softplus(alpha + dt_bias) * a` (both `[T][v_heads]`).
    fn delta_gates(
        &self,
        beta: &mut Self::Act,
        alpha: &mut Self::Act,
        dt_bias: &Self::Vector,
        a: &Self::Vector,
    ) -> Result<()>;
    /// The delta rule of each row's tokens in order, per value head, through that row's
    /// state of layer `s.slot`: `x` is the convolution's `[T][q | k | v]` (queries and
    /// keys L2-normed), `gates` the `delta_gates` output. Returns `[T][value_dim]`.
    fn delta_rule(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        x: &Self::Act,
        gates: (&Self::Act, &Self::Act),
        s: &DeltaShape,
    ) -> Result<Self::Act>;
    /// RMSNorm of each run of `w`'s length of `x`, times SiLU(`z`) (qwen35's gated norm).
    fn gated_rms_norm(&self, x: &mut Self::Act, w: &Self::Vector, z: &Self::Act, eps: f32) -> Result<()>;
    /// Write each row's new K/V for `layer`, then attend each row's queries over its own
    /// cache. Returns `[T][n_heads * head_dim]`.
    fn attend(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        layer: usize,
        qkv: (&Self::Act, &Self::Act, &Self::Act),
        spec: &AttnSpec,
    ) -> Result<Self::Act>;
    /// `rope_qk` of the queries and keys, then `attend` (on a GPU one launch fewer: the
    /// keys are rotated as they are stored).
    fn rope_attend(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&mut Self::Act, &mut Self::Act, &Self::Act),
        rope: Rotary,
        spec: &AttnSpec,
    ) -> Result<Self::Act> {
        self.rope_qk(p, (q, k), (rope.q_heads, rope.k_heads), rope.table, rope.style)?;
        self.attend(p, rows, layer, (q, k, v), spec)
    }
    /// `attend`, then `matmul` of its output by `w` (on a GPU, a pass of decode rows
    /// quantizes the attention output for the matmul in the attention kernel).
    fn attend_matmul(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        layer: usize,
        qkv: (&Self::Act, &Self::Act, &Self::Act),
        spec: &AttnSpec,
        w: &Self::Matrix,
    ) -> Result<Self::Act> {
        let a = self.attend(p, rows, layer, qkv, spec)?;
        self.matmul(p, w, &a)
    }
    /// `rope_attend`, then `matmul` of its output by `w` (as `attend_matmul`).
    #[allow(clippy::too_many_arguments)]
    fn rope_attend_matmul(
        &self,
        p: &mut Self::Pass,
        rows: &mut [Row<'_>],
        layer: usize,
        qkv: (&mut Self::Act, &mut Self::Act, &Self::Act),
        rope: Rotary,
        spec: &AttnSpec,
        w: &Self::Matrix,
    ) -> Result<Self::Act> {
        let a = self.rope_attend(p, rows, layer, qkv, rope, spec)?;
        self.matmul(p, w, &a)
    }
    /// The mixture of experts of the normed rows `x`: each row's chosen experts' SwiGLU
    /// MLPs, weighted and summed as llama.cpp's `build_moe_ffn` does (`kernels::moe`).
    /// A row's result never depends on the other rows of the pass.
    fn moe(&self, p: &Self::Pass, x: &Self::Act, e: &Self::Experts) -> Result<Self::Act>;
    fn silu_mul(&self, g: &mut Self::Act, u: &Self::Act) -> Result<()>;
    fn gelu_mul(&self, g: &mut Self::Act, u: &Self::Act) -> Result<()>;
    fn swiglu_oai(&self, g: &mut Self::Act, u: &Self::Act) -> Result<()>;
    fn add(&self, x: &mut Self::Act, y: &Self::Act) -> Result<()>;
    /// Make every product with `m` add `b` where the backend can do it in the matmul
    /// itself (the CUDA GEMV's epilogue); `b` comes back where it cannot, for `add_bias`.
    fn attach_bias(&self, _m: &mut Self::Matrix, b: Self::Vector) -> Result<Option<Self::Vector>> {
        Ok(Some(b))
    }
    /// `x[t] += b` for every row `t` (the Q/K/V biases of qwen2).
    fn add_bias(&self, x: &mut Self::Act, b: &Self::Vector) -> Result<()>;
    /// Each stacked row of `x` times the attention temperature at its position (mistral3's
    /// queries, `AttnTemperature::at`).
    fn temperature(&self, p: &Self::Pass, x: &mut Self::Act, t: AttnTemperature) -> Result<()>;
    /// End the pass: commit every row's new positions, then final norm and output
    /// projection of the rows each `Row::logits` asks for; one logits vector per row.
    fn finish(
        &self,
        p: Self::Pass,
        rows: &mut [Row<'_>],
        x: &Self::Act,
        norm: &Self::Vector,
        eps: f32,
        lm_head: &Self::Matrix,
    ) -> Result<Vec<Vec<f32>>>;
}
