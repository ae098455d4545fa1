//! Host side of `kernels/hybrid.cu`: Qwen3.5's Gated DeltaNet and gated-attention ops and
//! qwen35moe's shared-expert gate (shape checks, launch geometry). The recurrent ops take
//! the pass's per-row state addresses (`KvPlan::rec`, `recurrent.rs`) and row ranges.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::ops::{RopeSpec, blocks_of, int, shape};
use super::programs::HYBRID;
use crate::backend::DeltaShape;
use crate::error::Result;
use crate::kernels::rope::RopeStyle;

/// Most taps of the convolution (`MAX_TAPS`) and the widest delta-rule head
/// (`DELTA_MAX_DIM`) the kernels take.
const MAX_TAPS: usize = 8;
const DELTA_MAX_DIM: usize = 256;

/// Where a pass's rows keep their recurrent states: each row's device address and its
/// first stacked token (then the total), as `KvPlan::rec` and `row_first`.
#[derive(Clone, Copy)]
pub(crate) struct StateRows<'a> {
    pub(crate) rec: &'a CudaSlice<u64>,
    pub(crate) row_first: &'a CudaSlice<i32>,
}

impl Gpu {
    fn out(&self, n: usize) -> Result<CudaSlice<f32>> {
        // SAFETY: f32 has no invalid bit patterns; each caller's kernel writes all `n`.
        unsafe { self.stream.alloc(n.max(1)) }.map_err(drv("alloc activations"))
    }

    fn check_state(s: &DeltaShape, rows: StateRows<'_>) -> Result<()> {
        let ok = (2..=MAX_TAPS).contains(&s.taps)
            && s.head_dim <= DELTA_MAX_DIM
            && s.slot < s.state.layers
            && s.state.conv == (s.taps - 1) * s.channels()
            && s.state.ssm == s.v_heads * s.head_dim * s.head_dim
            && rows.row_first.len() == rows.rec.len() + 1;
        shape(ok, || format!("a delta-net layer the kernels do not take: {s:?}"))
    }

    /// `Backend::ssm_conv` of `x` (`[T][channels]`) with weights `w` (`[channel][taps]`).
    pub(crate) fn ssm_conv(
        &self,
        rows: StateRows<'_>,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        s: &DeltaShape,
    ) -> Result<CudaSlice<f32>> {
        Self::check_state(s, rows)?;
        let ch = s.channels();
        shape(x.len().is_multiple_of(ch) && w.len() == ch * s.taps, || {
            format!("x {} / w {} for {ch} channels of {} taps", x.len(), w.len(), s.taps)
        })?;
        let mut out = self.out(x.len())?;
        let f = self.function(&HYBRID, "ssm_conv")?;
        let cfg = LaunchConfig {
            grid_dim: (int(rows.rec.len())? as u32, ch.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (chi, taps, simd) = (int(ch)?, int(s.taps)?, int(ch & !15)?);
        let off = (s.slot * s.state.conv) as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(&mut out).arg(rows.rec).arg(rows.row_first).arg(&chi).arg(&taps).arg(&off).arg(&simd);
        // SAFETY: shapes checked; each row's state holds `layers * conv` convolution
        // floats (`sync_recurrent`) and row_first bounds the tokens of x.
        unsafe { b.launch(cfg) }.map_err(drv("ssm_conv"))?;
        Ok(out)
    }

    /// `Backend::l2_norm_heads`.
    pub(crate) fn l2_norm_heads(
        &self,
        x: &mut CudaSlice<f32>,
        (width, n, head): (usize, usize, usize),
        eps: f32,
    ) -> Result<()> {
        let ok = head > 0 && n.is_multiple_of(head) && n <= width && x.len().is_multiple_of(width);
        shape(ok, || format!("{} values in rows of {width}, {n} normed in heads of {head}", x.len()))?;
        let rows = x.len() / width;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let f = self.function(&HYBRID, "l2_norm_heads")?;
        let cfg = LaunchConfig {
            grid_dim: (int(rows)? as u32, int(n / head)? as u32, 1),
            block_dim: (head.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wi, hi) = (int(width)?, int(head)?);
        let (e, inv) = (eps / head as f32, 1.0 / (head as f32).sqrt());
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&wi).arg(&hi).arg(&e).arg(&inv);
        // SAFETY: rows * width values; every head lies within its row.
        unsafe { b.launch(cfg) }.map_err(drv("l2_norm_heads"))?;
        Ok(())
    }

    /// `Backend::delta_gates`.
    pub(crate) fn delta_gates(
        &self,
        beta: &mut CudaSlice<f32>,
        alpha: &mut CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        a: &CudaSlice<f32>,
    ) -> Result<()> {
        let (n, vh) = (beta.len(), dt_bias.len());
        let ok = vh > 0 && alpha.len() == n && a.len() == vh && n.is_multiple_of(vh);
        shape(ok, || format!("gates {n} / {} for {vh} heads ({} decays)", alpha.len(), a.len()))?;
        let f = self.function(&HYBRID, "delta_gates")?;
        let (ni, vi) = (int(n)?, int(vh)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(beta).arg(alpha).arg(dt_bias).arg(a).arg(&ni).arg(&vi);
        // SAFETY: n values in beta and alpha, vh in dt_bias and a.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("delta_gates"))?;
        Ok(())
    }

    /// `Backend::delta_rule`: `x` the convolution's `[T][q | k | v]`, `gates` (β, g)
    /// `[T][v_heads]`. Returns `[T][value_dim]`.
    pub(crate) fn delta_rule(
        &self,
        rows: StateRows<'_>,
        x: &CudaSlice<f32>,
        (beta, g): (&CudaSlice<f32>, &CudaSlice<f32>),
        s: &DeltaShape,
    ) -> Result<CudaSlice<f32>> {
        Self::check_state(s, rows)?;
        let ch = s.channels();
        let t = x.len() / ch;
        let ok = x.len() == t * ch && beta.len() == t * s.v_heads && g.len() == beta.len();
        shape(ok, || format!("x {} / gates {} {} for {ch} channels", x.len(), beta.len(), g.len()))?;
        let mut out = self.out(t * s.value_dim())?;
        let f = self.function(&HYBRID, "delta_rule")?;
        let cfg = LaunchConfig {
            grid_dim: (int(rows.rec.len())? as u32, int(s.v_heads)? as u32, s.head_dim.div_ceil(4) as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (kh, vh, d) = (int(s.k_heads)?, int(s.v_heads)?, int(s.head_dim)?);
        let off = (s.state.layers * s.state.conv + s.slot * s.state.ssm) as i64;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(beta).arg(g).arg(&mut out).arg(rows.rec).arg(rows.row_first);
        b.arg(&kh).arg(&vh).arg(&d).arg(&off).arg(&scale);
        // SAFETY: shapes checked; each row's state holds every layer's convolution and
        // delta-rule floats (`sync_recurrent`); row_first bounds the tokens of x.
        unsafe { b.launch(cfg) }.map_err(drv("delta_rule"))?;
        Ok(out)
    }

    /// `Backend::gated_rms_norm`.
    pub(crate) fn gated_rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        z: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<()> {
        let width = w.len();
        let ok = width > 0 && x.len().is_multiple_of(width) && z.len() == x.len();
        shape(ok, || format!("x {} / z {} in runs of {width}", x.len(), z.len()))?;
        let runs = x.len() / width;
        if runs == 0 {
            return Ok(());
        }
        let f = self.function(&HYBRID, "gated_rms_norm")?;
        let cfg = LaunchConfig {
            grid_dim: (int(runs)? as u32, 1, 1),
            block_dim: (width.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wi, simd) = (int(width)?, int(width & !15)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(z).arg(&wi).arg(&eps).arg(&simd);
        // SAFETY: runs * width values in x and z, width in w.
        unsafe { b.launch(cfg) }.map_err(drv("gated_rms_norm"))?;
        Ok(())
    }

    /// `Backend::sigmoid_mul`.
    pub(crate) fn sigmoid_mul(&self, x: &mut CudaSlice<f32>, gate: &CudaSlice<f32>) -> Result<()> {
        let n = x.len();
        shape(gate.len() == n, || format!("gate {} for {n} values", gate.len()))?;
        let f = self.function(&HYBRID, "sigmoid_mul")?;
        let ni = int(n)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(gate).arg(&ni);
        // SAFETY: n values in both.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("sigmoid_mul"))?;
        Ok(())
    }

    /// `Backend::split_halves`.
    pub(crate) fn split_halves(&self, x: &CudaSlice<f32>, half: usize) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        shape(half > 0 && x.len().is_multiple_of(2 * half), || format!("{} values in heads of 2 x {half}", x.len()))?;
        let n = x.len() / 2;
        let (mut a, mut g) = (self.out(n)?, self.out(n)?);
        let f = self.function(&HYBRID, "split_halves")?;
        let (hi, ni) = (int(half)?, int(n)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&mut a).arg(&mut g).arg(&hi).arg(&ni);
        // SAFETY: x holds 2n values, a and g n each.
        unsafe { b.launch(blocks_of(n, 256)?) }.map_err(drv("split_halves"))?;
        Ok((a, g))
    }

    /// RoPE of the first `spec.head_dim` dimensions of each `stride`-wide head of `x`
    /// (`[T][spec.heads][stride]`) at positions `pos` (`Backend::rope_partial`).
    pub(crate) fn rope_partial(
        &self,
        x: &mut CudaSlice<f32>,
        pos: &CudaSlice<i32>,
        spec: RopeSpec,
        stride: usize,
    ) -> Result<()> {
        let RopeSpec { heads, head_dim, style, .. } = spec;
        let rows = pos.len();
        let ok =
            head_dim.is_multiple_of(2) && head_dim <= stride && head_dim <= 2048 && x.len() == rows * heads * stride;
        shape(ok, || format!("x has {} values, not {rows} x {heads} x {stride} (rotating {head_dim})", x.len()))?;
        if rows == 0 || heads == 0 || head_dim == 0 {
            return Ok(());
        }
        let (theta_scale, pairs, freq_scale, mscale) = spec.angle_args();
        let half = head_dim / 2;
        let f = self.function(&HYBRID, "rope_partial")?;
        let cfg = LaunchConfig {
            grid_dim: (int(rows)? as u32, int(heads)? as u32, 1),
            block_dim: (half.next_multiple_of(32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hi, si, hf, neox) = (int(heads)?, int(stride)?, int(half)?, i32::from(style == RopeStyle::Neox));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(pos).arg(&hi).arg(&si).arg(&hf).arg(&theta_scale).arg(&pairs).arg(&freq_scale).arg(&mscale);
        b.arg(&neox);
        // SAFETY: shape checked; pairs is null or holds head_dim values (`RopeAngles::terms`).
        unsafe { b.launch(cfg) }.map_err(drv("rope_partial"))?;
        Ok(())
    }

    /// qwen35moe's shared expert into the routed experts' sum `y`: each row plus the
    /// expert's output `o` times sigmoid(x · w) (`x` the normed rows, `w` `[hidden]`).
    pub(crate) fn shared_gate_add(
        &self,
        y: &mut CudaSlice<f32>,
        o: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
    ) -> Result<()> {
        let width = w.len();
        let ok = width > 0 && y.len().is_multiple_of(width) && o.len() == y.len() && x.len() == y.len();
        shape(ok, || format!("y {} / o {} / x {} in rows of {width}", y.len(), o.len(), x.len()))?;
        let rows = y.len() / width;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function(&HYBRID, "shared_gate_add")?;
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let wi = int(width)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(y).arg(o).arg(x).arg(w).arg(&wi);
        // SAFETY: rows * width values in y, o and x; width in w.
        unsafe { b.launch(cfg) }.map_err(drv("shared_gate_add"))?;
        Ok(())
    }
}
