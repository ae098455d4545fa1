//! A mixture of experts on the CPU (llama.cpp's `build_moe_ffn`): per token, an f32 router
//! picks `used` of the layer's experts (`route`), each an MLP; their outputs are
//! multiplied by the token's weights and summed in the routing order, each product
//! rounded before its sum (ggml's `mul`, then one `add` per expert). qwen3moe: softmax
//! gating, weights renormalized, SwiGLU experts. gpt-oss (`MoeKind::GptOss`): the router's
//! bias added to its logits, the top logits' softmax as weights, a bias after each of an
//! expert's matmuls (ggml's `add_id`: the chosen expert's row, one f32 add), SwiGLU-OAI.
//! qwen35moe: qwen3moe's routing plus a gated shared expert (`shared`).
//!
//! The experts stay in the file's mapping (`Gguf::mapping`) until a token is first routed
//! to one, which reads that expert's three matrices into the kernels' layout once: only
//! chosen experts are read (a 30B-A3B file's 128 experts per layer are ~95 % of it).
//!
//! The router's matmul is ggml's f32 one for a 16-multiple width (tinyBLAS: 16 FMA lanes,
//! then GCC's 512-bit reduction). The experts run as matrices of their own, each over the
//! rows routed to it, all of a layer's experts in one pool call for gate and up and one
//! for down (the rows grouped by expert: `plan`; gate and up pick each expert's rows from
//! the layer's input, each input row quantized once for every expert that takes it, as
//! ggml's `mul_mat_id` quantizes its input once): ggml quantizes each activation row as a
//! dense matmul does and takes the one-row kernel of the format (vec-dot, or the repacked gemv for
//! Q4_K), which is what every row of `Linear` computes under the default numerics — so a
//! row's result does not depend on the rows it is batched with, nor on which of them
//! share its experts.

mod plan;
mod route;
mod shared;

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use crate::config::{MoeConfig, MoeKind};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Stored};
use crate::kernels::ops;
use crate::kernels::{Linear, Src, forward_each, parallel_for};
use candle_core::quantized::GgmlDType;
use plan::Plan;

/// One layer's router and experts. The experts stay in the file's mapping until a token
/// is first routed to one; then its three matrices are read into the kernels' layout
/// (`Linear`), once. Experts no token chooses are never read.
pub struct Experts {
    /// `[experts][hidden]`, f32 as the file stores it.
    router: Vec<f32>,
    /// gpt-oss's `ffn_gate_inp.bias` (`[experts]`).
    router_bias: Option<Vec<f32>>,
    /// gpt-oss's `ffn_{gate,up,down}_exps.bias`: `[experts][width]` twice, then
    /// `[experts][hidden]`.
    biases: Option<[Vec<f32>; 3]>,
    kind: MoeKind,
    map: Arc<Mmap>,
    /// `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: where each lies in the file.
    stacks: [Stack; 3],
    loaded: Vec<OnceLock<[Linear; 3]>>,
    /// qwen35moe's shared expert, added after the routed ones.
    shared: Option<shared::Shared>,
    hidden: usize,
    used: usize,
}

/// A 3-D tensor of stacked `[out_dim, in_dim]` matrices, one per expert.
struct Stack {
    name: String,
    bytes: Range<usize>,
    dtype: Stored,
    in_dim: usize,
    out_dim: usize,
}

impl Stack {
    fn locate(g: &Gguf, name: String, experts: usize, in_dim: usize, out_dim: usize) -> Result<Self> {
        let dims = g.dims(&name)?;
        let (bytes, dtype) = g.tensor_range(&name)?;
        let row_ok = in_dim.is_multiple_of(dtype.block_size());
        if dims != [experts, out_dim, in_dim] || !row_ok || !bytes.len().is_multiple_of(experts) {
            let reason = format!("shape {dims:?} of {dtype:?}, expected [{experts}, {out_dim}, {in_dim}]");
            return Err(Error::Tensor { name, reason });
        }
        Ok(Self { name, bytes, dtype, in_dim, out_dim })
    }

    /// Expert `e`'s matrix, read from the mapping.
    fn matrix(&self, map: &Mmap, experts: usize, e: usize) -> Result<Linear> {
        let per = self.bytes.len() / experts;
        let at = self.bytes.start + e * per;
        Linear::from_stored(&self.name, &map[at..at + per], self.dtype, self.in_dim, self.out_dim)
    }
}

impl Experts {
    /// Layer `layer`'s `ffn_gate_inp` (the router, which must be f32 with rows a multiple
    /// of 16 wide, as ggml's f32 matmul takes them) and where its `ffn_{gate,up,down}_exps`
    /// lie. The first expert is read here, so a format the kernels refuse fails the load.
    pub fn load(g: &Gguf, layer: usize, hidden: usize, m: MoeConfig) -> Result<Self> {
        let n = |s: &str| format!("blk.{layer}.{s}.weight");
        let name = n("ffn_gate_inp");
        let bad = |reason: String| Error::Tensor { name: name.clone(), reason };
        let dims = g.dims(&name)?;
        if dims != [m.experts, hidden] {
            return Err(bad(format!("shape {dims:?}, expected [{}, {hidden}]", m.experts)));
        }
        let (bytes, dtype) = g.raw_stored(&name)?;
        // llama.cpp's converter fuses gate|up only when asked (`--fuse-gate-up-exps`).
        if g.has_tensor(&n("ffn_gate_up_exps")) {
            let reason = "(gate and up experts fused) is not supported: convert without --fuse-gate-up-exps".into();
            return Err(Error::Tensor { name: n("ffn_gate_up_exps"), reason });
        }
        if dtype != Stored::Ggml(GgmlDType::F32) || !hidden.is_multiple_of(16) {
            return Err(bad(format!("a {dtype:?} router {hidden} wide is not supported (f32, a multiple of 16)")));
        }
        let router = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let stack = |s: &str, i: usize, o: usize| Stack::locate(g, n(s), m.experts, i, o);
        let bias = |s: &str, len: usize| g.f32_tensor(&format!("blk.{layer}.{s}.bias"), len);
        let (router_bias, biases) = match m.kind {
            MoeKind::Qwen3 => (None, None),
            MoeKind::GptOss => (
                Some(bias("ffn_gate_inp", m.experts)?),
                Some([
                    bias("ffn_gate_exps", m.experts * m.width)?,
                    bias("ffn_up_exps", m.experts * m.width)?,
                    bias("ffn_down_exps", m.experts * hidden)?,
                ]),
            ),
        };
        let experts = Self {
            router,
            router_bias,
            biases,
            kind: m.kind,
            map: g.mapping(),
            stacks: [
                stack("ffn_gate_exps", hidden, m.width)?,
                stack("ffn_up_exps", hidden, m.width)?,
                stack("ffn_down_exps", m.width, hidden)?,
            ],
            loaded: (0..m.experts).map(|_| OnceLock::new()).collect(),
            shared: m.shared.map(|w| shared::Shared::load(g, layer, hidden, w)).transpose()?,
            hidden,
            used: m.used,
        };
        experts.expert(0)?;
        Ok(experts)
    }

    /// Expert `e`'s gate, up and down matrices, read on first use.
    fn expert(&self, e: usize) -> Result<&[Linear; 3]> {
        if let Some(m) = self.loaded[e].get() {
            return Ok(m);
        }
        let n = self.loaded.len();
        let [g, u, d] = &self.stacks;
        let read = [g.matrix(&self.map, n, e)?, u.matrix(&self.map, n, e)?, d.matrix(&self.map, n, e)?];
        Ok(self.loaded[e].get_or_init(|| read))
    }

    /// The router's logits for one normed row (plus its bias, gpt-oss).
    fn logits(&self, x: &[f32]) -> Vec<f32> {
        let mut l: Vec<f32> =
            self.router.chunks_exact(self.hidden).map(|w| super::attention::dot_lanes(w, x)).collect();
        if let Some(b) = &self.router_bias {
            l.iter_mut().zip(b).for_each(|(l, b)| *l += b);
        }
        l
    }

    /// A row's experts and weights, in the order their outputs are summed.
    pub(crate) fn route(&self, x: &[f32]) -> Vec<(usize, f32)> {
        match self.kind {
            MoeKind::Qwen3 => route::route(&self.logits(x), self.used),
            MoeKind::GptOss => route::route_softmax_weight(&self.logits(x), self.used),
        }
    }

    /// Every row's route (`route`), the rows spread over the pool.
    fn routes(&self, x: &[f32]) -> Vec<Vec<(usize, f32)>> {
        let h = self.hidden;
        let slots: Vec<OnceLock<Vec<(usize, f32)>>> = x.chunks_exact(h).map(|_| OnceLock::new()).collect();
        parallel_for(slots.len(), x.len() * self.loaded.len(), |rows| {
            for r in rows {
                let _ = slots[r].set(self.route(&x[r * h..][..h]));
            }
        });
        slots.into_iter().map(|s| s.into_inner().expect("every row routed")).collect()
    }

    /// The layer's output for the normed rows `x` (`[T][hidden]`). The rows are grouped
    /// by expert (`plan`); every chosen expert's gate and up matrices then go to the pool
    /// in one call, on its rows picked from `x`, and its down matrices in another.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let h = self.hidden;
        let routes = self.routes(x);
        let chosen: Vec<Vec<usize>> = routes.iter().map(|r| r.iter().map(|&(e, _)| e).collect()).collect();
        let plan = Plan::new(&chosen, self.loaded.len(), self.used);
        let mats = plan.groups.iter().map(|&(e, _)| self.expert(e)).collect::<Result<Vec<_>>>()?;
        let w = self.stacks[0].out_dim;
        let n = plan.order.len();
        let (mut gate, mut up) = (vec![0.0f32; n * w], vec![0.0f32; n * w]);
        let mut jobs = Vec::with_capacity(2 * mats.len());
        let mut outs = Vec::with_capacity(2 * mats.len());
        for ((((_, rows), [wg, wu, _]), g), u) in
            plan.groups.iter().zip(&mats).zip(plan.split(&mut gate, w)).zip(plan.split(&mut up, w))
        {
            let xe = Src::Picked { x, rows: &plan.order[rows.clone()] };
            jobs.extend([(wg, xe, rows.len()), (wu, xe, rows.len())]);
            outs.extend([g, u]);
        }
        forward_each(&jobs, &mut outs)?;
        self.activate(&plan, &mut gate, &mut up, w);
        let mut down = vec![0.0f32; n * h];
        let jobs: Vec<_> = plan
            .groups
            .iter()
            .zip(&mats)
            .map(|((_, rows), [_, _, wd])| (wd, Src::Rows(&gate[rows.start * w..rows.end * w]), rows.len()))
            .collect();
        forward_each(&jobs, &mut plan.split(&mut down, h))?;
        if let Some([_, _, bd]) = &self.biases {
            for ((e, _), d) in plan.groups.iter().zip(plan.split(&mut down, h)) {
                add_row(d, &bd[e * h..][..h]);
            }
        }
        let mut y = vec![0.0f32; x.len()];
        for (r, (yr, route)) in y.chunks_exact_mut(h).zip(&routes).enumerate() {
            for (slot, &(_, w)) in route.iter().enumerate() {
                let d = &down[plan.at[r * self.used + slot] * h..][..h];
                if slot == 0 {
                    yr.iter_mut().zip(d).for_each(|(y, &d)| *y = d * w);
                } else {
                    yr.iter_mut().zip(d).for_each(|(y, &d)| *y += d * w);
                }
            }
        }
        if let Some(s) = &self.shared {
            s.add_to(x, &mut y)?;
        }
        Ok(y)
    }

    /// The experts' activation of the stacked gate and up outputs (`[rows][width]`), into
    /// `gate`: SwiGLU, or gpt-oss's biases then SwiGLU-OAI. Both go value by value, so
    /// one call over every expert's rows computes what a call per expert would (SwiGLU's
    /// 16-lane tails permitting: a width not a multiple of 16 goes expert by expert).
    fn activate(&self, plan: &Plan, gate: &mut [f32], up: &mut [f32], w: usize) {
        let Some([bg, bu, _]) = &self.biases else {
            if w.is_multiple_of(16) {
                ops::silu_mul(gate, up);
            } else {
                for ((_, rows), g) in plan.groups.iter().zip(plan.split(gate, w)) {
                    ops::silu_mul(g, &up[rows.start * w..rows.end * w]);
                }
            }
            return;
        };
        for (((e, _), g), u) in plan.groups.iter().zip(plan.split(gate, w)).zip(plan.split(up, w)) {
            add_row(g, &bg[e * w..][..w]);
            add_row(u, &bu[e * w..][..w]);
        }
        ops::swiglu_oai(gate, up);
    }
}

/// `b` added to every row of `x` (`[rows][b.len()]`).
fn add_row(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
    }
}

#[cfg(test)]
#[path = "tests.rs"]
pub(crate) mod tests;
