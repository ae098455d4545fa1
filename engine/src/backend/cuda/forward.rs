//! `Backend` on an NVIDIA GPU: activations are device buffers, weights stay in their
//! quantized formats (repacked at upload), the KV cache is mirrored on the device
//! (`kv.rs`), and only the token ids go in and the requested logits come out.
//!
//! Decode rows take the int8 GEMV kernel (8 rows per launch), long prefill chunks the
//! int8 tensor-core MMQ kernel (`mmq.rs`) or cuBLAS on the same values widened
//! (`gemm.rs`; `gemm::Prefill` says which);
//! buffers are allocated per op (stream-ordered, no memsets), and the pass synchronizes
//! once, at the end, to copy the new K/V and the logits back. Decode steps run as CUDA
//! graphs (`graph.rs`): `begin` and `finish` take and return the step's fixed buffers
//! when the stream is being captured.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

use super::device::{Gpu, drv};
use super::formats::KERNEL_TYPES;
use super::graph::{Graphs, Step, graphs_wanted};
use super::moe::DeviceExperts;
use super::ops::{ActFormat, DeviceAct, RopeSpec};
pub use super::pass::CudaPass;
use super::rope::RopeTables;
use super::sinks::SinkTables;
use super::weights::{DeviceWeights, MatrixBytes};
use crate::backend::batch::{Row, split};
use crate::backend::{Backend, DeltaShape, DeviceKind, Gate, Rotary};
use crate::config::{AttnTemperature, MoeConfig};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Stored};
use crate::kernels::AttnSpec;
use crate::kernels::rope::{RopeAngles, RopeStyle};

/// A GPU, shared by every model loaded on it; and one model's captured decode steps
/// (each model loads its own `CudaBackend`).
#[derive(Clone)]
pub struct CudaBackend {
    pub(super) gpu: Arc<Gpu>,
    ordinal: usize,
    pub(super) graphs: Arc<Mutex<Graphs>>,
    pub(super) ropes: Arc<RopeTables>,
    sinks: Arc<SinkTables>,
}

impl CudaBackend {
    pub fn open(ordinal: usize) -> Result<Self> {
        Ok(Self::on(Gpu::open(ordinal)?, ordinal))
    }

    /// GPU 0, or `None` with one log line saying why not.
    pub fn try_open_default() -> Option<Self> {
        Gpu::try_open_default().map(|g| Self::on(g, 0))
    }

    fn on(gpu: Gpu, ordinal: usize) -> Self {
        let graphs = Arc::new(Graphs::new(graphs_wanted()));
        Self { gpu: Arc::new(gpu), ordinal, graphs, ropes: Arc::default(), sinks: Arc::default() }
    }

    /// One forward pass over `rows` by `forward` (the model's), a decode step through
    /// its CUDA graph.
    pub(crate) fn step<F>(&self, vocab: usize, rows: &mut [Row<'_>], forward: F) -> Result<Vec<Vec<f32>>>
    where
        F: FnMut(&mut [Row<'_>]) -> Result<Vec<Vec<f32>>>,
    {
        self.gpu.step(&self.graphs, vocab, rows, forward)
    }

    /// Turn decode graphs on or off (off drops the captured ones).
    #[cfg(test)]
    pub(crate) fn set_graphs(&self, on: bool) {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).set(on);
    }

    /// Refuse a model whose weights (GGUF `file_bytes`) cannot fit the free memory.
    pub fn check_fit(&self, file_bytes: u64) -> Result<()> {
        let (free, total) = self.gpu.memory()?;
        super::fit::check(super::fit::weight_estimate(file_bytes), free as u64, total as u64)
            .map_err(|reason| Error::Cuda { op: "fit the model", reason })
    }

    pub fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda { ordinal: self.ordinal, name: self.gpu.name() }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// An activation buffer for an op that writes every value (no memset queued).
    pub(super) fn alloc(&self, n: usize) -> Result<CudaSlice<f32>> {
        // SAFETY: f32 has no invalid bit patterns, and every caller passes the buffer
        // as the output of one op that writes all `n` values before anything reads it.
        unsafe { self.gpu.stream.alloc(n) }.map_err(drv("alloc activations"))
    }

    /// The queries with the device address of their heads' sinks (0 without).
    fn with_sinks<'q>(&self, q: &'q CudaSlice<f32>, spec: &AttnSpec) -> Result<(&'q CudaSlice<f32>, u64)> {
        let Some(sinks) = spec.sinks else { return Ok((q, 0)) };
        Ok((q, self.sinks.get(&self.gpu, sinks)?))
    }

    /// RoPE of the queries and keys, the keys and values stored (`rope_kv_store`).
    fn rope_store(
        &self,
        p: &mut CudaPass,
        layer: usize,
        qkv: (&mut CudaSlice<f32>, &mut CudaSlice<f32>, &CudaSlice<f32>),
        rope: Rotary,
    ) -> Result<()> {
        let (heads, head_dim, base, style) = (rope.q_heads, p.head_dim, p.bases[rope.table], rope.style);
        let rs = RopeSpec { heads, head_dim, base, style, scaled: p.scaled[rope.table] };
        self.gpu.rope_kv_store(&mut p.kv, layer, qkv, rope.k_heads, rs)
    }

    /// Attention (K/V already stored), then its output times `w`. In a pass of decode
    /// rows only (all GEMV) whose matmul takes blocks of 32, the attention kernel
    /// quantizes its output for the GEMV itself (`Gpu::attention` with an activation).
    fn attention_matmul(
        &self,
        p: &CudaPass,
        layer: usize,
        q: &CudaSlice<f32>,
        spec: &AttnSpec,
        w: &DeviceWeights,
    ) -> Result<CudaSlice<f32>> {
        let format = Self::act_format(w)?;
        let decode_only = p.kv.n_tiles == 0 && p.runs.iter().all(|r| !r.1);
        if !(decode_only && format.block() == 32 && spec.head_dim.is_multiple_of(32)) {
            let a = self.gpu.attention(&p.kv, layer, self.with_sinks(q, spec)?, spec, None)?;
            let [y] = self.matmul_runs(&p.runs, [w], &a)?;
            return Ok(y);
        }
        let mut act = DeviceAct::alloc(&self.gpu, format, p.kv.total, w.k)?;
        self.gpu.attention(&p.kv, layer, self.with_sinks(q, spec)?, spec, Some(&mut act))?;
        let [y] = self.matmul_acts(&p.runs, [w], &[(act, None)])?;
        Ok(y)
    }

    /// Rows `rows` of `name`, an `[n, k]` matrix (all of them but for a fused weight).
    fn upload(&self, g: &Gguf, name: &str, k: usize, n: usize, rows: Range<usize>) -> Result<DeviceWeights> {
        let dims = g.dims(name)?;
        if dims != [n, k] {
            return Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("shape {dims:?}, expected [{n}, {k}]"),
            });
        }
        let (bytes, dtype) = g.raw_rows_stored(name, rows.clone())?;
        if ActFormat::for_weights(dtype).is_none() {
            let name_of = |t: &Stored| match t {
                Stored::Ggml(d) => format!("{d:?}"),
                other => format!("{other:?}"),
            };
            let have: Vec<String> = KERNEL_TYPES.iter().map(name_of).collect();
            return Err(Error::Tensor {
                name: name.to_owned(),
                reason: format!("{} has no CUDA kernel ({} do)", name_of(&dtype), have.join(", ")),
            });
        }
        DeviceWeights::upload(&self.gpu, MatrixBytes { name, dtype, bytes, k, n: rows.len() })
    }
}

impl Backend for CudaBackend {
    type Act = CudaSlice<f32>;
    type Matrix = DeviceWeights;
    type Vector = CudaSlice<f32>;
    type Table = DeviceWeights;
    type Pass = CudaPass;
    type Experts = DeviceExperts;

    fn experts(&self, g: &Gguf, layer: usize, hidden: usize, moe: MoeConfig) -> Result<DeviceExperts> {
        DeviceExperts::load(&self.gpu, g, layer, hidden, moe)
    }

    fn moe(&self, p: &CudaPass, x: &CudaSlice<f32>, e: &DeviceExperts) -> Result<CudaSlice<f32>> {
        let mut y = self.gpu.moe_runs(x, e, &p.runs)?;
        if let Some(s) = &e.shared {
            let [g, u] = self.matmul_many(p, [&s.gate, &s.up], x)?;
            let o = self.gated_matmul(p, g, &u, Gate::Silu, &s.down)?;
            self.gpu.shared_gate_add(&mut y, &o, x, &s.gate_inp)?;
        }
        Ok(y)
    }

    fn matrix(&self, g: &Gguf, name: &str, in_dim: usize, out_dim: usize) -> Result<DeviceWeights> {
        self.upload(g, name, in_dim, out_dim, 0..out_dim)
    }

    fn matrix_rows(&self, g: &Gguf, name: &str, k: usize, n: usize, rows: Range<usize>) -> Result<DeviceWeights> {
        self.upload(g, name, k, n, rows)
    }

    fn vector(&self, g: &Gguf, name: &str, n: usize) -> Result<CudaSlice<f32>> {
        let v = g.f32_tensor(name, n)?;
        self.gpu.stream.clone_htod(&v).map_err(drv("upload weights"))
    }

    fn table(&self, g: &Gguf, name: &str, vocab: usize, hidden: usize) -> Result<DeviceWeights> {
        self.upload(g, name, hidden, vocab, 0..vocab)
    }

    fn begin(&self, rows: &mut [Row<'_>], head_dim: usize, rope_bases: &[f32]) -> Result<CudaPass> {
        self.begin_planned(rows, head_dim, head_dim, rope_bases)
    }

    fn begin_scaled(&self, rows: &mut [Row<'_>], ropes: &[RopeAngles<'_>]) -> Result<CudaPass> {
        self.begin_tables(rows, ropes.first().map_or(0, |r| r.head_dim), ropes)
    }

    fn begin_partial(&self, rows: &mut [Row<'_>], attn_head_dim: usize, ropes: &[RopeAngles<'_>]) -> Result<CudaPass> {
        self.begin_tables(rows, attn_head_dim, ropes)
    }

    fn prepare_rope(&self, angles: &RopeAngles<'_>) -> Result<()> {
        self.ropes.get(&self.gpu, angles, false).map(drop)
    }

    fn prepare_sinks(&self, sinks: &[f32]) -> Result<()> {
        self.sinks.get(&self.gpu, sinks).map(drop)
    }

    fn embed(&self, p: &CudaPass, table: &DeviceWeights) -> Result<CudaSlice<f32>> {
        let mut out = self.alloc(p.kv.total * table.k)?;
        self.gpu.embed(table, &p.ids, &mut out)?;
        Ok(out)
    }

    fn scale(&self, x: &mut CudaSlice<f32>, s: f32) -> Result<()> {
        self.gpu.scale(x, s)
    }

    fn rms_norm(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, eps: f32) -> Result<CudaSlice<f32>> {
        let mut out = self.alloc(x.len())?;
        self.gpu.rms_norm(x, w, &mut out, eps)?;
        Ok(out)
    }

    fn rms_norm_inplace(&self, x: &mut CudaSlice<f32>, w: &CudaSlice<f32>, eps: f32) -> Result<()> {
        self.gpu.rms_norm_inplace(x, w, eps)
    }

    fn matmul(&self, p: &CudaPass, w: &DeviceWeights, x: &CudaSlice<f32>) -> Result<CudaSlice<f32>> {
        let [y] = self.matmul_many(p, [w], x)?;
        Ok(y)
    }

    fn matmul_many<const N: usize>(
        &self,
        p: &CudaPass,
        w: [&DeviceWeights; N],
        x: &CudaSlice<f32>,
    ) -> Result<[CudaSlice<f32>; N]> {
        self.matmul_runs(&p.runs, w, x)
    }

    fn norm_matmul_many<const N: usize>(
        &self,
        p: &CudaPass,
        x: &CudaSlice<f32>,
        norm: &CudaSlice<f32>,
        eps: f32,
        w: [&DeviceWeights; N],
    ) -> Result<[CudaSlice<f32>; N]> {
        let acts = self.acts_for(&p.runs, &w, x.len() / w[0].k, |a| self.gpu.norm_quantize(x, norm, eps, a))?;
        self.matmul_acts(&p.runs, w, &acts)
    }

    fn add_norm_matmul_many<const N: usize>(
        &self,
        p: &CudaPass,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        norm: &CudaSlice<f32>,
        eps: f32,
        w: [&DeviceWeights; N],
    ) -> Result<[CudaSlice<f32>; N]> {
        // One quantized input only: the add must happen once.
        let one_format = w.iter().all(|wi| ActFormat::for_weights(wi.dtype) == ActFormat::for_weights(w[0].dtype));
        if !one_format {
            self.add(x, y)?;
            return self.norm_matmul_many(p, x, norm, eps, w);
        }
        let acts = self.acts_for(&p.runs, &w, x.len() / w[0].k, |a| self.gpu.add_norm_quantize(x, y, norm, eps, a))?;
        self.matmul_acts(&p.runs, w, &acts)
    }

    fn gated_matmul(
        &self,
        p: &CudaPass,
        g: CudaSlice<f32>,
        u: &CudaSlice<f32>,
        gate: Gate,
        w: &DeviceWeights,
    ) -> Result<CudaSlice<f32>> {
        let acts = self.acts_for(&p.runs, &[w], g.len() / w.k, |a| self.gpu.gate_quantize(&g, u, gate, a))?;
        let [y] = self.matmul_acts(&p.runs, [w], &acts)?;
        Ok(y)
    }

    fn rope(&self, p: &CudaPass, x: &mut CudaSlice<f32>, heads: usize, table: usize, style: RopeStyle) -> Result<()> {
        let spec = RopeSpec { heads, head_dim: p.head_dim, base: p.bases[table], style, scaled: p.scaled[table] };
        self.gpu.rope(x, &p.kv.tok_pos, spec)
    }

    fn rope_qk(
        &self,
        p: &CudaPass,
        (q, k): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        (q_heads, k_heads): (usize, usize),
        table: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (head_dim, base, scaled) = (p.head_dim, p.bases[table], p.scaled[table]);
        let spec = RopeSpec { heads: q_heads, head_dim, base, style, scaled };
        self.gpu.rope_qk((q, k), k_heads, &p.kv.tok_pos, spec)
    }

    fn rope_partial(
        &self,
        p: &CudaPass,
        x: &mut CudaSlice<f32>,
        (heads, stride): (usize, usize),
        table: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let spec = RopeSpec { heads, head_dim: p.head_dim, base: p.bases[table], style, scaled: p.scaled[table] };
        self.gpu.rope_partial(x, &p.kv.tok_pos, spec, stride)
    }

    fn split_halves(&self, x: &CudaSlice<f32>, half: usize) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        self.gpu.split_halves(x, half)
    }

    fn sigmoid_mul(&self, x: &mut CudaSlice<f32>, gate: &CudaSlice<f32>) -> Result<()> {
        self.gpu.sigmoid_mul(x, gate)
    }

    fn ssm_conv(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        s: &DeltaShape,
    ) -> Result<CudaSlice<f32>> {
        self.gpu.ssm_conv(p.state_rows(), x, w, s)
    }

    fn l2_norm_heads(&self, x: &mut CudaSlice<f32>, dims: (usize, usize, usize), eps: f32) -> Result<()> {
        self.gpu.l2_norm_heads(x, dims, eps)
    }

    fn delta_gates(
        &self,
        beta: &mut CudaSlice<f32>,
        alpha: &mut CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        a: &CudaSlice<f32>,
    ) -> Result<()> {
        self.gpu.delta_gates(beta, alpha, dt_bias, a)
    }

    fn delta_rule(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        x: &CudaSlice<f32>,
        gates: (&CudaSlice<f32>, &CudaSlice<f32>),
        s: &DeltaShape,
    ) -> Result<CudaSlice<f32>> {
        self.gpu.delta_rule(p.state_rows(), x, gates, s)
    }

    fn gated_rms_norm(&self, x: &mut CudaSlice<f32>, w: &CudaSlice<f32>, z: &CudaSlice<f32>, eps: f32) -> Result<()> {
        self.gpu.gated_rms_norm(x, w, z, eps)
    }

    fn attend(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        spec: &AttnSpec,
    ) -> Result<CudaSlice<f32>> {
        self.gpu.kv_store(&mut p.kv, layer, k, v)?;
        self.gpu.attention(&p.kv, layer, self.with_sinks(q, spec)?, spec, None)
    }

    fn attend_matmul(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        spec: &AttnSpec,
        w: &DeviceWeights,
    ) -> Result<CudaSlice<f32>> {
        self.gpu.kv_store(&mut p.kv, layer, k, v)?;
        self.attention_matmul(p, layer, q, spec, w)
    }

    fn rope_attend_matmul(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&mut CudaSlice<f32>, &mut CudaSlice<f32>, &CudaSlice<f32>),
        rope: Rotary,
        spec: &AttnSpec,
        w: &DeviceWeights,
    ) -> Result<CudaSlice<f32>> {
        self.rope_store(p, layer, (q, k, v), rope)?;
        self.attention_matmul(p, layer, q, spec, w)
    }

    fn rope_attend(
        &self,
        p: &mut CudaPass,
        _rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&mut CudaSlice<f32>, &mut CudaSlice<f32>, &CudaSlice<f32>),
        rope: Rotary,
        spec: &AttnSpec,
    ) -> Result<CudaSlice<f32>> {
        self.rope_store(p, layer, (q, k, v), rope)?;
        self.gpu.attention(&p.kv, layer, self.with_sinks(q, spec)?, spec, None)
    }

    fn silu_mul(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        self.gpu.silu_mul(g, u)
    }

    fn gelu_mul(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        self.gpu.gelu_mul(g, u)
    }

    fn swiglu_oai(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        self.gpu.swiglu_oai(g, u)
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        self.gpu.add(x, y)
    }

    fn attach_bias(&self, m: &mut DeviceWeights, b: CudaSlice<f32>) -> Result<Option<CudaSlice<f32>>> {
        if b.len() != m.n {
            return Err(Error::Cuda { op: "bias", reason: format!("{} values for {} outputs", b.len(), m.n) });
        }
        m.bias = Some(b);
        Ok(None)
    }

    fn add_bias(&self, x: &mut CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        self.gpu.add_rows(&mut x.slice_mut(..), b)
    }

    fn temperature(&self, p: &CudaPass, x: &mut CudaSlice<f32>, t: AttnTemperature) -> Result<()> {
        self.gpu.attn_temperature(x, &p.kv.tok_pos, t)
    }

    fn finish(
        &self,
        p: CudaPass,
        rows: &mut [Row<'_>],
        x: &CudaSlice<f32>,
        norm: &CudaSlice<f32>,
        eps: f32,
        lm_head: &DeviceWeights,
    ) -> Result<Vec<Vec<f32>>> {
        let (hidden, vocab) = (norm.len(), lm_head.n);
        if let Some(mut out) = p.capture {
            // Every row is one token that wants logits: no gather, no download here.
            let h = self.rms_norm(x, norm, eps)?;
            let [y] = self.matmul_runs(&[(0..p.kv.total, false)], [lm_head], &h)?;
            self.gpu.stream.memcpy_dtod(&y, &mut out).map_err(drv("copy logits"))?;
            let step = Step { ids: p.ids, kv: p.kv, logits: out };
            self.graphs.lock().unwrap_or_else(|e| e.into_inner()).put_captured(step);
            return Ok(Vec::new());
        }
        let (picked, counts) = p.spans.logit_rows(rows);
        let y = if picked.is_empty() {
            None
        } else {
            let h = self.gpu.gather_rows(x, &picked, hidden)?;
            let h = self.rms_norm(&h, norm, eps)?;
            let [y] = self.matmul_runs(&[(0..picked.len(), false)], [lm_head], &h)?;
            Some(y)
        };
        tracing::debug!(tokens = p.kv.total, queue_us = p.started.elapsed().as_micros() as u64, "pass queued");
        let logits = self.gpu.land(rows, &p.spans, &p.kv, y.as_ref())?;
        Ok(split(logits, &counts, vocab))
    }
}
