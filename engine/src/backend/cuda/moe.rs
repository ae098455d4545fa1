//! A mixture of experts on the GPU (qwen3moe, gpt-oss): the router, the chosen experts'
//! gated MLPs and their weighted sum, every step on the device so a decode step stays one
//! captured graph (no routing decision comes back to the host).
//!
//! - `moe_logits` (`kernels/moe.cu`): each token's router logits (plus gpt-oss's router
//!   bias), a half-warp an expert over the whole GPU; `moe_pick`, a warp a token: its top
//!   `used` experts and their weights, in the CPU's arithmetic (`kernels::moe`'s
//!   `route`: softmax, top-k, renormalized; or gpt-oss's `route_softmax_weight`: top-k of
//!   the logits, a softmax of those);
//! - `moe_sort` (one block) orders the (token, slot) pairs by expert and cuts each
//!   expert's rows into chunks of up to eight; `moe_gather` copies each pair's token row
//!   into that order, which is quantized once;
//! - the three expert stacks (`ffn_{gate,up,down}_exps`) are uploaded whole as matrices
//!   of `experts * out` rows; `gemv_id_<type>` (`kernels/gemv_id.cu`) runs each chunk
//!   against its expert's rows, the weights read once per chunk, each row in the GEMV's
//!   own arithmetic (a row's result does not depend on the rows sharing its chunk), and
//!   gpt-oss's expert biases as the GEMV's epilogue (the chosen expert's row of each
//!   stacked `[experts][out]` bias, ggml's `add_id`);
//! - `gate_quantize` forms SiLU(gate) * up (gpt-oss: SwiGLU-OAI) and quantizes it for the
//!   down stack;
//! - `moe_sum` adds each token's slots in routing order, each product rounded first.
//!
//! qwen35moe's shared expert runs as a dense SwiGLU MLP beside them (`SharedExpert`,
//! through the backend's matmuls), its output times sigmoid(x · `ffn_gate_inp_shexp`)
//! added to their sum (`shared_gate_add`, `kernels/hybrid.cu`).
//!
//! A pass's rows of long prefill chunks (`ExpertMatmul::Mmq`) take the grouped
//! tensor-core MMQ instead (`mmq_id.rs`): `moe_tiles` cuts each expert's sorted rows into
//! tiles of up to 64, and each tile is multiplied by its expert's rows, the weights read
//! once per 64 rows; a stack whose format has no MMQ body keeps `gemv_id`.

use std::ops::Range;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::formats::type_index;
use super::mmq_id::has_mmq_id_kernel;
use super::ops::{ActFormat, DeviceAct, blocks_of, int, shape};
use super::programs::{GEMV, MOE};
use super::weights::{DeviceWeights, MatrixBytes};
use crate::backend::Gate;
use crate::config::{MoeConfig, MoeKind};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Stored};
use candle_core::quantized::GgmlDType;

/// `moe.cu`'s bound on the experts a router may have.
const MAX_EXPERTS: usize = 512;

// Kernel names in `KERNEL_TYPES` order.
const ID: [&str; 15] = [
    "gemv_id_q4_0",
    "gemv_id_q4_1",
    "gemv_id_q5_0",
    "gemv_id_q8_0",
    "gemv_id_q4_k",
    "gemv_id_q6_k",
    "gemv_id_q5_1",
    "gemv_id_iq4_nl",
    "gemv_id_q5_k",
    "gemv_id_q3_k",
    "gemv_id_q2_k",
    "gemv_id_iq4_xs",
    "gemv_id_f16",
    "gemv_id_bf16",
    "gemv_id_mxfp4",
];

/// How the experts' matrices multiply a pass's rows: each row's arithmetic is fixed by
/// this choice alone, never by the other rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertMatmul {
    /// The grouped GEMV (`gemv_id`): decode rows and short chunks.
    Gemv,
    /// The grouped tensor-core MMQ (`mmq_id`) for the stacks whose format has a kernel,
    /// the grouped GEMV for the others: long prefill chunks (`gemm_min_rows`), on devices
    /// with int8 `mma.sync` (`Gpu::has_mmq`).
    Mmq,
}

/// One layer's router and expert stacks on the device.
pub struct DeviceExperts {
    /// `[experts][hidden]`, f32.
    router: CudaSlice<f32>,
    /// gpt-oss's `ffn_gate_inp.bias` (`[experts]`).
    router_bias: Option<CudaSlice<f32>>,
    /// `ffn_gate_exps`, `ffn_up_exps` (`experts * width` rows of `hidden`) and
    /// `ffn_down_exps` (`experts * hidden` rows of `width`); gpt-oss's with their
    /// `[experts][out]` biases attached (`DeviceWeights::bias`, one value a stacked row).
    stacks: [DeviceWeights; 3],
    /// qwen35moe's shared expert.
    pub(crate) shared: Option<SharedExpert>,
    moe: MoeConfig,
    hidden: usize,
}

/// qwen35moe's shared expert: `ffn_gate_inp_shexp` (`[hidden]`, f32) and its SwiGLU MLP
/// (`ffn_{gate,up,down}_shexp`).
pub(crate) struct SharedExpert {
    pub(crate) gate_inp: CudaSlice<f32>,
    pub(crate) gate: DeviceWeights,
    pub(crate) up: DeviceWeights,
    pub(crate) down: DeviceWeights,
}

impl SharedExpert {
    fn load(gpu: &Gpu, g: &Gguf, layer: usize, hidden: usize, width: usize) -> Result<Self> {
        let n = |s: &str| format!("blk.{layer}.{s}.weight");
        let name = n("ffn_gate_inp_shexp");
        let (_, dtype) = g.raw_stored(&name)?;
        if dtype != Stored::Ggml(GgmlDType::F32) {
            return Err(Error::Tensor {
                name,
                reason: format!("a {dtype:?} shared-expert gate is not supported (f32)"),
            });
        }
        let gate_inp = gpu.stream.clone_htod(&g.f32_tensor(&name, hidden)?).map_err(drv("upload shared gate"))?;
        let matrix = |s: &str, k: usize, out: usize| -> Result<DeviceWeights> {
            let name = n(s);
            let dims = g.dims(&name)?;
            let (bytes, dtype) = g.raw_stored(&name)?;
            if dims != [out, k] || ActFormat::for_weights(dtype).is_none() {
                let reason = format!("{dtype:?} {dims:?}, expected [{out}, {k}] of a type with a CUDA kernel");
                return Err(Error::Tensor { name, reason });
            }
            DeviceWeights::upload(gpu, MatrixBytes { name: &name, dtype, bytes, k, n: out })
        };
        Ok(Self {
            gate_inp,
            gate: matrix("ffn_gate_shexp", hidden, width)?,
            up: matrix("ffn_up_shexp", hidden, width)?,
            down: matrix("ffn_down_shexp", width, hidden)?,
        })
    }
}

impl DeviceExperts {
    /// Layer `layer`'s router and experts, uploaded whole (with gpt-oss's biases).
    pub fn load(gpu: &Gpu, g: &Gguf, layer: usize, hidden: usize, moe: MoeConfig) -> Result<Self> {
        let n = |s: &str| format!("blk.{layer}.{s}.weight");
        let name = n("ffn_gate_inp");
        let bad = |name: &str, reason: String| Error::Tensor { name: name.to_owned(), reason };
        let dims = g.dims(&name)?;
        let (bytes, dtype) = g.raw_stored(&name)?;
        let fits = moe.experts <= MAX_EXPERTS && (1..=moe.experts).contains(&moe.used) && hidden.is_multiple_of(16);
        if dims != [moe.experts, hidden] || dtype != Stored::Ggml(GgmlDType::F32) || !fits {
            let want = format!(
                "an f32 [{}, {hidden}] router of at most {MAX_EXPERTS} experts, rows a multiple of 16, {} used",
                moe.experts, moe.used
            );
            return Err(bad(&name, format!("{dtype:?} {dims:?}, expected {want}")));
        }
        let router: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let router = gpu.stream.clone_htod(&router).map_err(drv("upload router"))?;
        let bias = |s: &str, len: usize| -> Result<CudaSlice<f32>> {
            let v = g.f32_tensor(&format!("blk.{layer}.{s}.bias"), len)?;
            gpu.stream.clone_htod(&v).map_err(drv("upload biases"))
        };
        let stack = |s: &str, k: usize, out: usize| -> Result<DeviceWeights> {
            let name = n(s);
            let dims = g.dims(&name)?;
            if dims != [moe.experts, out, k] {
                return Err(bad(&name, format!("shape {dims:?}, expected [{}, {out}, {k}]", moe.experts)));
            }
            let (bytes, dtype) = g.raw_stored(&name)?;
            let mut w = DeviceWeights::upload(gpu, MatrixBytes { name: &name, dtype, bytes, k, n: moe.experts * out })?;
            if moe.kind == MoeKind::GptOss {
                w.bias = Some(bias(s, moe.experts * out)?);
            }
            Ok(w)
        };
        let stacks = [
            stack("ffn_gate_exps", hidden, moe.width)?,
            stack("ffn_up_exps", hidden, moe.width)?,
            stack("ffn_down_exps", moe.width, hidden)?,
        ];
        for w in &stacks {
            type_index(w.dtype())?;
        }
        let router_bias = match moe.kind {
            MoeKind::Qwen3 => None,
            MoeKind::GptOss => Some(bias("ffn_gate_inp", moe.experts)?),
        };
        let shared = moe.shared.map(|w| SharedExpert::load(gpu, g, layer, hidden, w)).transpose()?;
        Ok(Self { router, router_bias, stacks, shared, moe, hidden })
    }

    /// The experts' gated activation and `moe_pick`'s kind.
    fn gate_and_route(&self) -> (Gate, i32) {
        match self.moe.kind {
            MoeKind::Qwen3 => (Gate::Silu, 0),
            MoeKind::GptOss => (Gate::SwigluOai, 1),
        }
    }
}

/// A pass's runs of rows (`CudaPass::runs`: a range and whether it is a long prefill
/// chunk's) grouped into maximal ranges of one `ExpertMatmul`: long chunks take the MMQ
/// where the device has it (`mmq`), everything else the GEMV.
pub(super) fn expert_runs(runs: &[(Range<usize>, bool)], mmq: bool) -> Vec<(Range<usize>, ExpertMatmul)> {
    let mut out: Vec<(Range<usize>, ExpertMatmul)> = Vec::new();
    for (rows, long) in runs {
        let how = if *long && mmq { ExpertMatmul::Mmq } else { ExpertMatmul::Gemv };
        match out.last_mut() {
            Some((r, h)) if *h == how && r.end == rows.start => r.end = rows.end,
            _ => out.push((rows.clone(), how)),
        }
    }
    out
}

impl Gpu {
    /// The mixture of experts of a pass's rows `x`, each run of rows by its own
    /// `ExpertMatmul` (`expert_runs`); a pass of several copies each run's rows out and
    /// its results back, so a row's result is the same whatever else the pass holds.
    pub fn moe_runs(
        &self,
        x: &CudaSlice<f32>,
        e: &DeviceExperts,
        runs: &[(Range<usize>, bool)],
    ) -> Result<CudaSlice<f32>> {
        let groups = expert_runs(runs, self.has_mmq());
        if let [(_, how)] = groups[..] {
            return self.moe(x, e, how);
        }
        let h = e.hidden;
        // SAFETY: every row of y belongs to one run (the runs cover the pass's rows) and
        // is written by its copy below before anything reads it.
        let mut y = unsafe { self.stream.alloc::<f32>(x.len()) }.map_err(drv("alloc moe"))?;
        for (rows, how) in groups {
            shape(rows.end * h <= x.len(), || format!("rows {rows:?} of {} values", x.len()))?;
            // SAFETY: plain floats, all written by the copy that follows.
            let mut part = unsafe { self.stream.alloc::<f32>(rows.len() * h) }.map_err(drv("alloc moe"))?;
            self.stream.memcpy_dtod(&x.slice(rows.start * h..rows.end * h), &mut part).map_err(drv("copy moe rows"))?;
            let out = self.moe(&part, e, how)?;
            let mut dst = y.slice_mut(rows.start * h..rows.end * h);
            self.stream.memcpy_dtod(&out, &mut dst).map_err(drv("copy moe rows"))?;
        }
        Ok(y)
    }

    /// The mixture of experts of the normed rows `x` (`[tokens][hidden]`), the experts'
    /// matrices multiplied by `how`.
    pub fn moe(&self, x: &CudaSlice<f32>, e: &DeviceExperts, how: ExpertMatmul) -> Result<CudaSlice<f32>> {
        let (h, MoeConfig { experts, used, width, .. }) = (e.hidden, e.moe);
        shape(x.len().is_multiple_of(h), || format!("x has {} values, rows of {h}", x.len()))?;
        let tokens = x.len() / h;
        let pairs = tokens * used;
        // Chunks of at most 8 rows of one expert: no more than this many.
        let max_chunks = pairs.div_ceil(8) + experts.min(pairs);
        let s = &self.stream;
        let (ti, hi, ei, ui, pi, ci) =
            (int(tokens)?, int(h)?, int(experts)?, int(used)?, int(pairs)?, int(max_chunks)?);
        // SAFETY (every alloc): plain integers and floats; each buffer is the output of
        // the next launch, which writes all of it before anything reads it.
        let alloc_i = |n: usize| unsafe { s.alloc::<i32>(n) }.map_err(drv("alloc moe"));
        let alloc_f = |n: usize| unsafe { s.alloc::<f32>(n) }.map_err(drv("alloc moe"));
        if tokens == 0 {
            return alloc_f(0);
        }
        let (mut ids, mut weights, mut logits) = (alloc_i(pairs)?, alloc_f(pairs)?, alloc_f(tokens * experts)?);
        let cfg = |grid: (usize, usize), threads: u32| -> Result<LaunchConfig> {
            Ok(LaunchConfig {
                grid_dim: (int(grid.0)? as u32, int(grid.1)? as u32, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        };
        let (gate_kind, kind) = e.gate_and_route();
        // The router's bias, or null.
        let bias = e.router_bias.as_ref().map_or(0, |b| b.device_ptr(s).0);
        let f = self.function(&MOE, "moe_logits")?;
        let mut b = s.launch_builder(&f);
        b.arg(x).arg(&e.router).arg(&bias).arg(&hi).arg(&ei).arg(&mut logits);
        // SAFETY: x holds tokens*h values, the router experts*h (h a multiple of 16) and its
        // bias, if any, experts values; the grid's y covers the experts eight a block and
        // logits holds tokens*experts.
        unsafe { b.launch(cfg((tokens, experts.div_ceil(8)), 128)?) }.map_err(drv("moe_logits"))?;
        let f = self.function(&MOE, "moe_pick")?;
        let mut b = s.launch_builder(&f);
        b.arg(&logits).arg(&ei).arg(&ui).arg(&kind).arg(&mut ids).arg(&mut weights);
        // SAFETY: logits holds tokens*experts (at most MAX_EXPERTS, the kernel's shared
        // arrays); 1 <= used <= experts; ids and weights hold tokens*used.
        unsafe { b.launch(cfg((tokens, 1), 32)?) }.map_err(drv("moe_pick"))?;

        let (mut pos, mut sorted, mut chunks) = (alloc_i(pairs)?, alloc_i(pairs)?, alloc_i(3 * max_chunks)?);
        let f = self.function(&MOE, "moe_sort")?;
        let mut b = s.launch_builder(&f);
        b.arg(&ids).arg(&pi).arg(&ei).arg(&ci).arg(&mut pos).arg(&mut sorted).arg(&mut chunks);
        // SAFETY: ids holds `pairs` experts below `experts` (<= MAX_EXPERTS = 2 * the
        // block's 256 threads, the kernel's shared counts); pos and sorted hold `pairs`,
        // chunks 3 * max_chunks, enough for any routing.
        unsafe { b.launch(cfg((1, 1), 256)?) }.map_err(drv("moe_sort"))?;
        let grouped = |w: &DeviceWeights| how == ExpertMatmul::Mmq && has_mmq_id_kernel(w.dtype());
        let tiles = if e.stacks.iter().any(grouped) { Some(self.moe_tiles(&ids, pairs, experts)?) } else { None };
        // One stack's product of the sorted rows: the tiles' MMQ or the chunks' GEMV.
        let matmul = |w: &DeviceWeights, n: usize, act: &DeviceAct, y: &mut CudaSlice<f32>| match &tiles {
            Some(t) if grouped(w) => self.mmq_id(w, n, act, t, y),
            _ => self.gemv_id(w, n, act, &chunks, y),
        };

        let mut xs = alloc_f(pairs * h)?;
        let f = self.function(&MOE, "moe_gather")?;
        let mut b = s.launch_builder(&f);
        b.arg(x).arg(&sorted).arg(&pi).arg(&ui).arg(&hi).arg(&mut xs);
        // SAFETY: sorted names pairs below tokens*used, so rows below tokens of x; xs
        // holds pairs*h.
        unsafe { b.launch(blocks_of(pairs * h, 256)?) }.map_err(drv("moe_gather"))?;

        let [gate_w, up_w, down_w] = &e.stacks;
        let act_of = |w: &DeviceWeights| {
            ActFormat::for_weights(w.dtype())
                .ok_or_else(|| Error::Cuda { op: "moe", reason: format!("no activation format for {:?}", w.dtype()) })
        };
        let mut ax = DeviceAct::alloc(self, act_of(gate_w)?, pairs, h)?;
        self.quantize(&xs, &mut ax)?;
        let (mut gate, mut up) = (alloc_f(pairs * width)?, alloc_f(pairs * width)?);
        matmul(gate_w, width, &ax, &mut gate)?;
        if act_of(up_w)? != ax.format {
            ax = DeviceAct::alloc(self, act_of(up_w)?, pairs, h)?;
            self.quantize(&xs, &mut ax)?;
        }
        matmul(up_w, width, &ax, &mut up)?;
        let mut ah = DeviceAct::alloc(self, act_of(down_w)?, pairs, width)?;
        self.gate_quantize(&gate, &up, gate_kind, &mut ah)?;
        let mut down = alloc_f(pairs * h)?;
        matmul(down_w, h, &ah, &mut down)?;

        let mut y = alloc_f(tokens * h)?;
        let f = self.function(&MOE, "moe_sum")?;
        let mut b = s.launch_builder(&f);
        b.arg(&down).arg(&pos).arg(&weights).arg(&ti).arg(&ui).arg(&hi).arg(&mut y);
        // SAFETY: down holds pairs rows of h and pos names rows below pairs; weights
        // holds pairs, y tokens*h.
        unsafe { b.launch(blocks_of(tokens * h, 256)?) }.map_err(drv("moe_sum"))?;
        Ok(y)
    }

    /// The grouped expert GEMV: for each chunk `[expert, first, rows]` of `chunks`,
    /// `y[first + i] = W[expert] . act[first + i]` for its rows; `w` is a stack of `n`-row
    /// matrices, `act` and `y` the sorted rows.
    fn gemv_id(
        &self,
        w: &DeviceWeights,
        n: usize,
        act: &DeviceAct,
        chunks: &CudaSlice<i32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.function(&GEMV, ID[type_index(w.dtype())?])?;
        // Four warps a block, one an output row.
        let grid = (int(chunks.len() / 3)? as u32, int(n.div_ceil(4))? as u32);
        self.launch_grouped(&f, grid, (w, n), act, chunks, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_chunks_take_the_mmq_where_the_device_has_it_and_neighbours_join() {
        use ExpertMatmul::{Gemv, Mmq};
        // decode rows, a long chunk, another long chunk, two decode rows.
        let runs = [(0..3, false), (3..40, true), (40..90, true), (90..92, false)];
        assert_eq!(expert_runs(&runs, true), vec![(0..3, Gemv), (3..90, Mmq), (90..92, Gemv)]);
        assert_eq!(expert_runs(&runs, false), vec![(0..92, Gemv)]);
        assert_eq!(expert_runs(&[(0..512, true)], true), vec![(0..512, Mmq)]);
        assert!(expert_runs(&[], true).is_empty());
    }
}
