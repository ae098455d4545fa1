//! Quantization fused into the op before a matmul (`kernels/quantize.cu`): RMSNorm, or
//! the gated activation of the MLP, computed and quantized in one kernel, the f32 values
//! never stored. Each value is computed by the same device code as the unfused op and
//! quantized by the same code as `quantize`, so the quantized activations are the ones
//! the two launches would make (tested bit for bit).

use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::ops::{ActFormat, DeviceAct};
use super::programs::QUANTIZE;
use crate::backend::Gate;
use crate::error::{Error, Result};

fn bad(reason: String) -> Error {
    Error::Cuda { op: "fused quantize", reason }
}

fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| bad(format!("{v} exceeds i32")))
}

impl DeviceAct {
    /// The block size, whether Q8_1 sums are wanted, and where the kernel's last array
    /// goes: Q8_1 sums (f32) or, for Q8_K, the sums of 16 (i32).
    fn fused_args(&mut self, s: &cudarc::driver::CudaStream) -> (i32, i32, u64) {
        let sums = match self.format {
            ActFormat::Q8K => self.bsums.device_ptr_mut(s).0,
            _ => self.s.device_ptr_mut(s).0,
        };
        (self.format.block() as i32, i32::from(self.format == ActFormat::Q8_1), sums)
    }
}

/// The launch of a row-wise norm-and-quantize kernel (a block a row) and the arguments
/// that follow its inputs.
struct RowQuant {
    cfg: LaunchConfig,
    width: i32,
    block: i32,
    with_sum: i32,
    qs: u64,
    d: u64,
    sums: u64,
    staged: i32,
}

impl RowQuant {
    /// For `act`'s rows, after checking `w` is one row wide and each input length is
    /// all the rows; `None` when there are no rows.
    fn new(act: &mut DeviceAct, w: &CudaSlice<f32>, inputs: &[usize]) -> Result<Option<RowQuant>> {
        let width = act.k;
        if w.len() != width || inputs.iter().any(|&n| n != act.rows * width) {
            return Err(bad(format!("inputs {inputs:?} / w {} values for {} rows of {width}", w.len(), act.rows)));
        }
        if act.rows == 0 {
            return Ok(None);
        }
        let threads = (width / act.format.block() * 32).clamp(32, 1024) as u32;
        // The row and the norm weights staged in shared memory (`norm_quantize_one`)
        // where they fit the 48 KB a launch gets without opting in (width ≤ 6,000).
        let bytes = 2 * width * 4;
        let staged = bytes + 512 <= 48 * 1024;
        let cfg = LaunchConfig {
            grid_dim: (int(act.rows)? as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: if staged { bytes as u32 } else { 0 },
        };
        let s = act.qs.stream().clone();
        let (block, with_sum, sums) = act.fused_args(&s);
        let (qs, d) = (act.qs.device_ptr_mut(&s).0, act.d.device_ptr_mut(&s).0);
        Ok(Some(RowQuant { cfg, width: int(width)?, block, with_sum, qs, d, sums, staged: i32::from(staged) }))
    }
}

impl Gpu {
    /// `act` = the quantized rows of `rms_norm(x, w, eps)` (`x` is `[act.rows][act.k]`).
    pub fn norm_quantize(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, eps: f32, act: &mut DeviceAct) -> Result<()> {
        if act.format.is_float() {
            // No quantization to fuse: the norm writes the values in place of it.
            self.rms_norm(x, w, &mut act.d, eps)?;
            return self.round_act(act);
        }
        let Some(r) = RowQuant::new(act, w, &[x.len()])? else { return Ok(()) };
        let f = self.function(&QUANTIZE, "norm_quantize")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(&r.width).arg(&eps).arg(&r.block).arg(&r.qs).arg(&r.d).arg(&r.sums).arg(&r.with_sum);
        b.arg(&r.staged);
        // SAFETY: x holds rows*width values, w width (RowQuant::new checked); the
        // activation arrays were sized for rows*width values of this format.
        unsafe { b.launch(r.cfg) }.map_err(drv("norm_quantize"))?;
        Ok(())
    }

    /// `x += y`, then `act` = the quantized rows of `rms_norm(x, w, eps)`, in one kernel.
    pub fn add_norm_quantize(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        act: &mut DeviceAct,
    ) -> Result<()> {
        if act.format.is_float() {
            self.add(x, y)?;
            return self.norm_quantize(x, w, eps, act);
        }
        let Some(r) = RowQuant::new(act, w, &[x.len(), y.len()])? else { return Ok(()) };
        let f = self.function(&QUANTIZE, "add_norm_quantize")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(y).arg(w).arg(&r.width).arg(&eps).arg(&r.block);
        b.arg(&r.qs).arg(&r.d).arg(&r.sums).arg(&r.with_sum).arg(&r.staged);
        // SAFETY: as norm_quantize; y holds rows*width values too.
        unsafe { b.launch(r.cfg) }.map_err(drv("add_norm_quantize"))?;
        Ok(())
    }

    /// `act` = the quantized values of `gate(g) * u` over the whole buffers.
    pub fn gate_quantize(&self, g: &CudaSlice<f32>, u: &CudaSlice<f32>, gate: Gate, act: &mut DeviceAct) -> Result<()> {
        let n = act.rows * act.k;
        if g.len() != n || u.len() < n {
            return Err(bad(format!("g {} / u {} values, need {n}", g.len(), u.len())));
        }
        if act.format.is_float() {
            // The unfused op's kernels on a copy of g in the activation's values.
            let mut v = act.d.slice_mut(..n);
            self.stream.memcpy_dtod(g, &mut v).map_err(drv("copy gate"))?;
            match gate {
                Gate::Gelu => self.gelu_mul(&mut act.d, u)?,
                Gate::Silu => self.silu_mul(&mut act.d, u)?,
                Gate::SwigluOai => self.swiglu_oai(&mut act.d, u)?,
            }
            return self.round_act(act);
        }
        let nblocks = n / act.format.block();
        if nblocks == 0 {
            return Ok(());
        }
        let f = self.function(&QUANTIZE, "gate_quantize")?;
        let cfg = LaunchConfig {
            grid_dim: (int(nblocks.div_ceil(8))? as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (block, with_sum, sums) = act.fused_args(&self.stream);
        let (qs, d) = (act.qs.device_ptr_mut(&self.stream).0, act.d.device_ptr_mut(&self.stream).0);
        // As `silu_mul`: ggml's exp on whole groups of 16 of the buffer, libm's on the tail.
        let (nb, simd) = (int(nblocks)?, int(n & !15)?);
        // `gate_val`'s kinds.
        let kind: i32 = match gate {
            Gate::Silu => 0,
            Gate::Gelu => 1,
            Gate::SwigluOai => 2,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(g).arg(u).arg(&nb).arg(&simd).arg(&kind).arg(&block).arg(&qs).arg(&d).arg(&sums).arg(&with_sum);
        // SAFETY: g and u hold n values; the activation arrays were sized for n values.
        unsafe { b.launch(cfg) }.map_err(drv("gate_quantize"))?;
        Ok(())
    }
}
