//! Host side of the op kernels: shape checks, launch geometry, and one method per op
//! on `Gpu`. All ops are queued on the device's one stream; nothing here synchronizes.

use cudarc::driver::{
    CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchArgs, LaunchConfig, PushKernelArg,
};

use super::device::{Gpu, drv};
pub use super::formats::ActFormat;
use super::formats::type_index;
use super::programs::{EMBED, OPS, QUANTIZE};
use super::weights::DeviceWeights;
use crate::config::AttnTemperature;
use crate::error::{Error, Result};
use crate::kernels::rope::RopeStyle;

/// Activation rows one GEMV launch takes (`MAXM` in `gemv.cu`).
pub const GEMV_MAX_ROWS: usize = 8;

/// The shape and kind of a rotary embedding.
#[derive(Clone, Copy, Debug)]
pub struct RopeSpec {
    pub heads: usize,
    pub head_dim: usize,
    pub base: f32,
    pub style: RopeStyle,
    /// A scaled table's terms; `None` for plain angles.
    pub scaled: Option<ScaledRope>,
}

/// A scaled rotary table on the device (`RopeAngles::terms`): the address of its per-pair
/// factors and YaRN mixes (the backend keeps them for its lifetime, so captured graphs
/// may hold the address), `freq_scale` and the factor on cos and sin.
#[derive(Clone, Copy, Debug)]
pub struct ScaledRope {
    pub pairs: u64,
    pub freq_scale: f32,
    pub mscale: f32,
}

impl RopeSpec {
    /// The rope kernels' angle arguments: theta_scale, pairs (0: plain), freq_scale, mscale.
    pub(crate) fn angle_args(&self) -> (f32, u64, f32, f32) {
        // The CPU's `RopeTable` computes this with the host powf; use the same value.
        let theta_scale = self.base.powf(-2.0 / self.head_dim as f32);
        match self.scaled {
            Some(s) => (theta_scale, s.pairs, s.freq_scale, s.mscale),
            None => (theta_scale, 0, 1.0, 1.0),
        }
    }
}

/// Quantized activations `[rows, k]` on the device.
pub struct DeviceAct {
    pub format: ActFormat,
    pub rows: usize,
    pub k: usize,
    pub qs: CudaSlice<i8>,
    pub d: CudaSlice<f32>,
    /// Q8_1 only: f16(d * sum(q)) per block.
    pub s: CudaSlice<f32>,
    /// Q8_K only: sums of each 16 values.
    pub bsums: CudaSlice<i32>,
}

pub(super) fn shape(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(Error::Cuda { op: "shape check", reason: what() }) }
}

pub(super) fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Cuda { op: "shape check", reason: format!("{v} exceeds i32") })
}

pub(super) fn blocks_of(threads: usize, per_block: usize) -> Result<LaunchConfig> {
    let grid = threads.div_ceil(per_block).max(1);
    Ok(LaunchConfig { grid_dim: (int(grid)? as u32, 1, 1), block_dim: (per_block as u32, 1, 1), shared_mem_bytes: 0 })
}

/// Views of a `DeviceAct` from one row on, pushed as a kernel's four activation
/// arguments (int8 values, scales, Q8_1 sums, Q8_K sums of 16).
pub(crate) struct ActRows<'a> {
    qs: CudaView<'a, i8>,
    d: CudaView<'a, f32>,
    s: CudaView<'a, f32>,
    bsums: CudaView<'a, i32>,
}

impl<'a> ActRows<'a> {
    pub(crate) fn push(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.qs).arg(&self.d).arg(&self.s).arg(&self.bsums);
    }
}

impl DeviceAct {
    /// The rows from `r0` on.
    pub(crate) fn rows_from(&self, r0: usize) -> ActRows<'_> {
        let kb = self.k / self.format.block();
        ActRows {
            qs: self.qs.slice(r0 * self.k..),
            d: self.d.slice(r0 * kb..),
            s: self.s.slice(r0 * kb..),
            bsums: self.bsums.slice(r0 * self.k / 16..),
        }
    }

    pub fn alloc(gpu: &Gpu, format: ActFormat, rows: usize, k: usize) -> Result<Self> {
        shape(k.is_multiple_of(format.block()), || format!("k = {k} is not a multiple of {}", format.block()))?;
        let blocks = rows * k / format.block();
        let s = &gpu.stream;
        let a = || drv("alloc activations");
        // SAFETY (each alloc): plain integers and floats, no invalid bit patterns;
        // `quantize` writes every array its format has before a GEMV reads it, and a
        // GEMV reads only those (Q8_1 sums, Q8_K bsums). No memset is queued.
        Ok(Self {
            format,
            rows,
            k,
            qs: unsafe { s.alloc(rows * k) }.map_err(a())?,
            d: unsafe { s.alloc(blocks) }.map_err(a())?,
            s: unsafe { s.alloc(blocks) }.map_err(a())?,
            bsums: unsafe { s.alloc(rows * k / 16) }.map_err(a())?,
        })
    }
}

impl Gpu {
    /// Quantize `x` (`[act.rows, act.k]`) into `act`.
    pub fn quantize(&self, x: &CudaSlice<f32>, act: &mut DeviceAct) -> Result<()> {
        shape(x.len() >= act.rows * act.k, || format!("x has {} values, need {}", x.len(), act.rows * act.k))?;
        let blocks = act.rows * act.k / act.format.block();
        let nb = int(blocks)?;
        let cfg = blocks_of(blocks * 32, 256)?;
        let mut b;
        let f;
        match act.format {
            ActFormat::Q8_0 | ActFormat::Q8_1 => {
                f = self.function(&QUANTIZE, "quantize_q8_32")?;
                let with_sum = i32::from(act.format == ActFormat::Q8_1);
                b = self.stream.launch_builder(&f);
                b.arg(x).arg(&mut act.qs).arg(&mut act.d).arg(&mut act.s).arg(&nb).arg(&with_sum);
                // SAFETY: x holds blocks*32 values; qs/d/s were sized for `blocks` in alloc.
                unsafe { b.launch(cfg) }.map_err(drv("quantize_q8_32"))?;
            }
            ActFormat::Q8K => {
                f = self.function(&QUANTIZE, "quantize_q8_k")?;
                b = self.stream.launch_builder(&f);
                b.arg(x).arg(&mut act.qs).arg(&mut act.d).arg(&mut act.bsums).arg(&nb);
                // SAFETY: as above; bsums holds 16 per super-block.
                unsafe { b.launch(cfg) }.map_err(drv("quantize_q8_k"))?;
            }
            ActFormat::F32 | ActFormat::Bf16 => return self.float_act(x, act),
        }
        Ok(())
    }

    /// The float formats' "quantization": `x` copied into `act.d`, rounded to bf16 for
    /// `Bf16` (the CPU's `acts_bf16`).
    pub(crate) fn float_act(&self, x: &CudaSlice<f32>, act: &mut DeviceAct) -> Result<()> {
        let n = act.rows * act.k;
        shape(x.len() >= n && act.d.len() >= n, || format!("x has {} values, need {n}", x.len()))?;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&QUANTIZE, "float_act")?;
        let (ni, bf16) = (int(n)?, i32::from(act.format == ActFormat::Bf16));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&mut act.d).arg(&ni).arg(&bf16);
        // SAFETY: x and act.d hold n values each (checked).
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("float_act"))?;
        Ok(())
    }

    /// A float activation's values, already in `act.d`, rounded to bf16 in place for
    /// `Bf16` (nothing for `F32`).
    pub(crate) fn round_act(&self, act: &mut DeviceAct) -> Result<()> {
        let n = act.rows * act.k;
        if act.format != ActFormat::Bf16 || n == 0 {
            return Ok(());
        }
        let f = self.function(&QUANTIZE, "round_bf16")?;
        let ni = int(n)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut act.d).arg(&ni);
        // SAFETY: act.d holds rows*k values (`DeviceAct::alloc` with block 1).
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("round_bf16"))?;
        Ok(())
    }

    /// Quantize `x` (`[act.rows, w.k]`) into `act`, then `gemv` into `y`.
    pub fn matmul(
        &self,
        w: &DeviceWeights,
        x: &CudaSlice<f32>,
        act: &mut DeviceAct,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.quantize(x, act)?;
        self.gemv(w, act, y)
    }

    /// `out[r] = x[r] / rms(x[r]) * w` for each row of width `w.len()`.
    pub fn rms_norm(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, out: &mut CudaSlice<f32>, eps: f32) -> Result<()> {
        shape(out.len() >= x.len(), || format!("out has {} values, x {}", out.len(), x.len()))?;
        let (xp, _) = x.device_ptr(&self.stream);
        let (op, _) = out.device_ptr_mut(&self.stream);
        self.rms_norm_at(xp, x.len(), w, op, eps)
    }

    /// `rms_norm` with the result written over `x`.
    pub fn rms_norm_inplace(&self, x: &mut CudaSlice<f32>, w: &CudaSlice<f32>, eps: f32) -> Result<()> {
        let n = x.len();
        let (xp, _) = x.device_ptr_mut(&self.stream);
        self.rms_norm_at(xp, n, w, xp, eps)
    }

    /// The kernel reads each element before the same thread writes it, so `x == out`
    /// is allowed; both hold `n` values (checked by the callers' borrows).
    fn rms_norm_at(&self, x: u64, n: usize, w: &CudaSlice<f32>, out: u64, eps: f32) -> Result<()> {
        let width = w.len();
        shape(width > 0 && n.is_multiple_of(width), || format!("x {n} not rows of {width}"))?;
        let rows = n / width;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function(&OPS, "rms_norm")?;
        // Enough threads that each loads a few values: one row's latency is the whole
        // kernel's when it normalizes a decode step's single row.
        let threads = width.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32;
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        let wi = int(width)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x).arg(w).arg(&out).arg(&wi).arg(&eps);
        // SAFETY: rows*width values at x and out (device allocations of n values); width in w.
        unsafe { b.launch(cfg) }.map_err(drv("rms_norm"))?;
        Ok(())
    }

    /// `x *= s`.
    pub fn scale(&self, x: &mut CudaSlice<f32>, s: f32) -> Result<()> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&OPS, "scale_inplace")?;
        let ni = int(n)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&s).arg(&ni);
        // SAFETY: n values in x.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("scale_inplace"))?;
        Ok(())
    }

    /// `x[r] += b` for every row `r` of `x` (`[rows][b.len()]`).
    pub fn add_rows(&self, x: &mut CudaViewMut<'_, f32>, b: &CudaSlice<f32>) -> Result<()> {
        let (n, width) = (x.len(), b.len());
        shape(width > 0 && n.is_multiple_of(width), || format!("{n} values are not rows of {width}"))?;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&OPS, "add_rows")?;
        let (wi, ni) = (int(width)?, int(n)?);
        let mut l = self.stream.launch_builder(&f);
        l.arg(x).arg(b).arg(&wi).arg(&ni);
        // SAFETY: n values in x, width in b.
        unsafe { l.launch(blocks_of(n, 256)?) }.map_err(drv("add_rows"))?;
        Ok(())
    }

    /// Each row `r` of `x` (`[pos.len()][width]`) times the attention temperature at
    /// position `pos[r]` (`AttnTemperature::at`).
    pub fn attn_temperature(&self, x: &mut CudaSlice<f32>, pos: &CudaSlice<i32>, t: AttnTemperature) -> Result<()> {
        let (n, rows) = (x.len(), pos.len());
        shape(rows > 0 && n.is_multiple_of(rows), || format!("{n} values are not {rows} rows"))?;
        let f = self.function(&OPS, "attn_temperature")?;
        let (wi, ni, floor) = (int(n / rows)?, int(n)?, t.floor as f32);
        let mut l = self.stream.launch_builder(&f);
        l.arg(x).arg(pos).arg(&wi).arg(&ni).arg(&floor).arg(&t.scale);
        // SAFETY: n values in x, one position per row.
        unsafe { l.launch(blocks_of(n, 256)?) }.map_err(drv("attn_temperature"))?;
        Ok(())
    }

    /// Rotate `x` (`[rows][heads][head_dim]`) in place; row r is at position `pos[r]`.
    pub fn rope(&self, x: &mut CudaSlice<f32>, pos: &CudaSlice<i32>, spec: RopeSpec) -> Result<()> {
        self.rope_launch(x, None, pos, spec)
    }

    /// `rope` of `q` (`spec.heads` heads) and of `k` (`k_heads`) in one launch.
    pub fn rope_qk(
        &self,
        (q, k): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        k_heads: usize,
        pos: &CudaSlice<i32>,
        spec: RopeSpec,
    ) -> Result<()> {
        self.rope_launch(q, Some((k, k_heads)), pos, spec)
    }

    fn rope_launch(
        &self,
        x: &mut CudaSlice<f32>,
        k: Option<(&mut CudaSlice<f32>, usize)>,
        pos: &CudaSlice<i32>,
        spec: RopeSpec,
    ) -> Result<()> {
        let RopeSpec { heads, head_dim, style, .. } = spec;
        let rows = pos.len();
        let fits = |x: &CudaSlice<f32>, heads: usize| x.len() == rows * heads * head_dim;
        shape(head_dim.is_multiple_of(2) && head_dim <= 2048 && fits(x, heads), || {
            format!("x has {} values, not {rows} x {heads} x {head_dim}", x.len())
        })?;
        if let Some((k, kh)) = &k {
            shape(fits(k, *kh), || format!("k has {} values, not {rows} x {kh} x {head_dim}", k.len()))?;
        }
        if rows == 0 {
            return Ok(());
        }
        let (theta_scale, pairs, freq_scale, mscale) = spec.angle_args();
        let half = head_dim / 2;
        let all_heads = heads + k.as_ref().map_or(0, |k| k.1);
        let f = self.function(&OPS, if k.is_some() { "rope_qk" } else { "rope" })?;
        let threads = half.div_ceil(32) * 32;
        let cfg = LaunchConfig {
            grid_dim: (int(rows)? as u32, int(all_heads)? as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hi, hf, neox) = (int(heads)?, int(half)?, i32::from(style == RopeStyle::Neox));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x);
        let ki;
        if let Some((k, kh)) = k {
            ki = int(kh)?;
            b.arg(k).arg(pos).arg(&hi).arg(&ki);
        } else {
            b.arg(pos).arg(&hi);
        }
        b.arg(&hf).arg(&theta_scale).arg(&pairs).arg(&freq_scale).arg(&mscale).arg(&neox);
        // SAFETY: x holds rows*heads*head_dim values (and k rows*kh*head_dim), pos rows;
        // pairs is null or holds head_dim values (`RopeAngles::terms`).
        unsafe { b.launch(cfg) }.map_err(drv("rope"))?;
        Ok(())
    }

    /// `g = silu(g) * u` over the whole buffer (ggml's exp on whole groups of 16).
    pub fn silu_mul(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        let n = g.len();
        shape(u.len() >= n, || format!("u has {} values, need {n}", u.len()))?;
        let f = self.function(&OPS, "silu_mul")?;
        let (ni, simd) = (int(n)?, int(n & !15)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(g).arg(u).arg(&ni).arg(&simd);
        // SAFETY: n values in g and u.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("silu_mul"))?;
        Ok(())
    }

    /// `g = gelu(g) * u` (tanh approximation through f16, as ggml's table).
    pub fn gelu_mul(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        self.binary("gelu_mul", g, u)
    }

    /// `g = swiglu_oai(g, u)` (gpt-oss's experts, `kernels::ops::swiglu_oai`).
    pub fn swiglu_oai(&self, g: &mut CudaSlice<f32>, u: &CudaSlice<f32>) -> Result<()> {
        self.binary("swiglu_oai", g, u)
    }

    /// `x += y`.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        self.binary("add_inplace", x, y)
    }

    fn binary(&self, name: &'static str, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        let n = x.len();
        shape(y.len() >= n, || format!("{name}: second operand has {} values, need {n}", y.len()))?;
        let f = self.function(&OPS, name)?;
        let ni = int(n)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(y).arg(&ni);
        // SAFETY: n values in both.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("elementwise op"))?;
        Ok(())
    }

    /// `out[r]` = first index of the largest value of row r of `x` (`[out.len(), n]`).
    pub fn argmax(&self, x: &CudaSlice<f32>, n: usize, out: &mut CudaSlice<i32>) -> Result<()> {
        let rows = out.len();
        shape(n > 0 && x.len() >= rows * n, || format!("x has {} values, need {rows} x {n}", x.len()))?;
        let f = self.function(&OPS, "argmax")?;
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        let ni = int(n)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&ni).arg(out);
        // SAFETY: rows*n values in x, rows in out.
        unsafe { b.launch(cfg) }.map_err(drv("argmax"))?;
        Ok(())
    }

    /// Embedding lookup: `out[r]` = row `ids[r]` of `w`, dequantized (`out` is
    /// `[ids.len(), w.k]`). Ids must be `< w.n`; the caller validates them.
    pub fn embed(&self, w: &DeviceWeights, ids: &CudaSlice<i32>, out: &mut CudaSlice<f32>) -> Result<()> {
        let rows = ids.len();
        shape(out.len() >= rows * w.k, || format!("out has {} values, need {rows} x {}", out.len(), w.k))?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function(&EMBED, "embed_rows")?;
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (k, ty) = (int(w.k)?, int(type_index(w.dtype)?)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux).arg(ids).arg(out).arg(&k).arg(&ty);
        // SAFETY: ids index rows of w (validated by the caller); out holds rows*k.
        unsafe { b.launch(cfg) }.map_err(drv("embed_rows"))?;
        Ok(())
    }
}
