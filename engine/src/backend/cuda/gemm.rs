//! Prefill matmuls through cuBLAS on the values the CPU multiplies: the activations
//! quantized to int8 blocks as the CPU quantizes them and expanded back, the weights
//! dequantized (ggml's dequantization). Two widths: f16 (both rounded to f16, products
//! summed in f32 on the tensor cores) and f32 (exact values, no TF32: differs from the
//! CPU's int8 dot products only in the order of f32 additions). Used for a sequence's
//! chunk of at least `gemm_min_rows()` tokens (where the GEMV kernel would re-read the
//! weights every 8 rows), one call per sequence's chunk, so a row's arithmetic does not
//! depend on the other sequences in the pass; decode rows always take the GEMV.

use std::ops::Range;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use half::f16;

use super::device::{Gpu, drv};
use super::formats::type_index;
use super::ops::{ActFormat, DeviceAct};
use super::programs::EMBED;
use super::weights::DeviceWeights;
use crate::error::{Error, Result};

/// A sequence's chunk takes the GEMM from this many rows (32; the environment's
/// `CORRAL_CUDA_GEMM_MIN_ROWS` overrides it, `0` meaning never: a diagnostic knob).
pub fn gemm_min_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| match std::env::var("CORRAL_CUDA_GEMM_MIN_ROWS").ok().and_then(|v| v.parse().ok()) {
        Some(0) => usize::MAX,
        Some(n) => n,
        None => 32,
    })
}

/// What a long prefill chunk is multiplied with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefill {
    /// The int8 tensor-core kernel (`mmq.rs`).
    Mmq,
    /// cuBLAS on f16 values.
    F16,
    /// cuBLAS on f32 values.
    F32,
    /// Nothing: every row takes the GEMV.
    Gemv,
}

impl Prefill {
    /// The choice for a device with `mmq` (int8 `mma.sync`) and `blas` (cuBLAS loaded):
    /// `wanted` (`CORRAL_CUDA_PREFILL`: `mmq`, `f16`, `f32`) where the device can, else
    /// f16 cuBLAS (1.5–4× the MMQ kernel's speed on an H200, the weights widened on every
    /// call included), else MMQ, else the GEMV.
    pub fn choose(wanted: Option<&str>, mmq: bool, blas: bool) -> Prefill {
        match wanted {
            Some("mmq") if mmq => Prefill::Mmq,
            Some("f16") if blas => Prefill::F16,
            Some("f32") if blas => Prefill::F32,
            _ if blas => Prefill::F16,
            _ if mmq => Prefill::Mmq,
            _ => Prefill::Gemv,
        }
    }

    /// Whether the GEMM runs go to cuBLAS.
    pub fn cublas(self) -> bool {
        matches!(self, Prefill::F16 | Prefill::F32)
    }
}

/// Whether the GEMM of weights taking activations of `format` is f32 whatever the
/// prefill width: BF16's (bf16 values past f16's range or below its normals would not
/// survive the f16 rounding; the f32 GEMM multiplies them exactly).
fn f32_for(format: Option<ActFormat>) -> bool {
    format == Some(ActFormat::Bf16)
}

/// A matrix or activations widened for cuBLAS.
pub(crate) enum Wide {
    F16(CudaSlice<f16>),
    F32(CudaSlice<f32>),
}

impl Wide {
    fn len(&self) -> usize {
        match self {
            Wide::F16(x) => x.len(),
            Wide::F32(x) => x.len(),
        }
    }

    /// (device address, cuBLAS type, bytes per value).
    fn raw(&self, gpu: &Gpu) -> (u64, blas_sys::cudaDataType_t, usize) {
        match self {
            Wide::F16(x) => (x.device_ptr(&gpu.stream).0, blas_sys::cudaDataType_t::CUDA_R_16F, 2),
            Wide::F32(x) => (x.device_ptr(&gpu.stream).0, blas_sys::cudaDataType_t::CUDA_R_32F, 4),
        }
    }
}

impl Gpu {
    /// Whether cuBLAS is loaded.
    pub fn has_gemm(&self) -> bool {
        self.blas.is_some()
    }

    /// What long prefill chunks take here (`Prefill::choose`).
    pub fn prefill(&self) -> Prefill {
        static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let wanted = WANTED.get_or_init(|| std::env::var("CORRAL_CUDA_PREFILL").ok());
        Prefill::choose(wanted.as_deref(), self.has_mmq(), self.has_gemm())
    }

    /// `w` widened for `prefill` (F16 or F32), `[n][k]`. BF16 weights always go to f32:
    /// f16's range would overflow or flush some of their values (`f32_for`).
    pub(crate) fn dequant_wide(&self, w: &DeviceWeights, prefill: Prefill) -> Result<Wide> {
        if prefill == Prefill::F32 || f32_for(ActFormat::for_weights(w.dtype)) {
            return self.dequant_f32(w).map(Wide::F32);
        }
        // SAFETY: f16 has no invalid bit patterns; the kernel writes all n*k values.
        let mut out = unsafe { self.stream.alloc::<f16>(w.n * w.k) }.map_err(drv("alloc f16 weights"))?;
        // In `KERNEL_TYPES` order.
        let names = [
            "dequant_f16_q4_0",
            "dequant_f16_q4_1",
            "dequant_f16_q5_0",
            "dequant_f16_q8_0",
            "dequant_f16_q4_k",
            "dequant_f16_q6_k",
            "dequant_f16_q5_1",
            "dequant_f16_iq4_nl",
            "dequant_f16_q5_k",
            "dequant_f16_q3_k",
            "dequant_f16_q2_k",
            "dequant_f16_iq4_xs",
            "dequant_f16_f16",
            "dequant_f16_bf16",
            "dequant_f16_mxfp4",
        ];
        let f = self.function(&EMBED, names[type_index(w.dtype)?])?;
        let groups = (w.n * w.k / 8).div_ceil(256);
        let cfg = LaunchConfig { grid_dim: (groups as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (n, k) = (w.n as i32, w.k as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux).arg(&mut out).arg(&n).arg(&k);
        // SAFETY: the weights hold n rows of k values in the layout the kernel reads.
        unsafe { b.launch(cfg) }.map_err(drv("dequant_f16"))?;
        Ok(Wide::F16(out))
    }

    /// Quantized activations widened for `prefill` (F16 or F32), `[rows][k]`.
    pub(crate) fn dequant_act_wide(&self, act: &DeviceAct, prefill: Prefill) -> Result<Wide> {
        match prefill {
            _ if prefill == Prefill::F32 || f32_for(Some(act.format)) => {
                self.widen_act(act, "dequant_act").map(Wide::F32)
            }
            _ => self.widen_act(act, "dequant_act_f16").map(Wide::F16),
        }
    }

    /// `w` dequantized to f32, `[n][k]`.
    pub(crate) fn dequant_f32(&self, w: &DeviceWeights) -> Result<CudaSlice<f32>> {
        // SAFETY: f32 has no invalid bit patterns; the kernel writes all n*k values.
        let mut out = unsafe { self.stream.alloc::<f32>(w.n * w.k) }.map_err(drv("alloc f32 weights"))?;
        let f = self.function(&EMBED, "dequant_f32")?;
        let ty = type_index(w.dtype)? as i32;
        let cfg = LaunchConfig { grid_dim: (w.n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let k = w.k as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux).arg(&mut out).arg(&k).arg(&ty);
        // SAFETY: the weights hold n rows of k values in the layout the kernel reads.
        unsafe { b.launch(cfg) }.map_err(drv("dequant_f32"))?;
        Ok(out)
    }

    /// Quantized activations expanded back (`[rows][k]` values of `T`) by `kernel`:
    /// `dequant_act` (f32, exact) or `dequant_act_f16` (rounded to f16).
    fn widen_act<T: DeviceRepr>(&self, act: &DeviceAct, kernel: &'static str) -> Result<CudaSlice<T>> {
        let n = act.rows * act.k;
        // SAFETY: f32 and f16 have no invalid bit patterns; the kernel writes all n values.
        let mut out = unsafe { self.stream.alloc::<T>(n) }.map_err(drv("alloc widened activations"))?;
        let f = self.function(&EMBED, kernel)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ni, block) = (n as i32, act.format.block() as i32);
        let mut b = self.stream.launch_builder(&f);
        // The float formats' values are their `d`: no int8 values (null).
        let null = 0u64;
        if act.format.is_float() {
            b.arg(&null);
        } else {
            b.arg(&act.qs);
        }
        b.arg(&act.d).arg(&mut out).arg(&ni).arg(&block);
        // SAFETY: qs holds n values (or is null: d holds them), d one per block of them; out holds n values of the
        // kernel's output type (T is f32 for dequant_act, f16 for dequant_act_f16).
        unsafe { b.launch(cfg) }.map_err(drv("widen activations"))?;
        Ok(out)
    }

    /// `y[r] = wh . xh[r]` for rows `rows` (`wh` is `[n][k]`, `xh` `[*][k]` of the same
    /// width, `y` `[*][n]`), summed in f32.
    pub(crate) fn gemm_rows(
        &self,
        wh: &Wide,
        (n, k): (usize, usize),
        xh: &Wide,
        rows: Range<usize>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let blas_handle =
            self.blas.as_ref().ok_or_else(|| Error::Cuda { op: "gemm", reason: "cuBLAS not loaded".into() })?;
        let ((a, a_type, size), (b, b_type, b_size)) = (wh.raw(self), xh.raw(self));
        if wh.len() != n * k || xh.len() < rows.end * k || y.len() < rows.end * n || size != b_size {
            return Err(Error::Cuda { op: "gemm", reason: "shape mismatch".into() });
        }
        let m = rows.len();
        if m == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (c, _) = y.device_ptr_mut(&self.stream);
        let (b, c) = (b + (rows.start * k * size) as u64, c + (rows.start * n * 4) as u64);
        // Column-major view: y^T (n x m) = W (stored [n][k], i.e. k x n, transposed) x
        // x^T (stored [m][k], i.e. k x m).
        // SAFETY: a holds n*k values, b from row `rows.start` holds m*k, c from that row
        // holds m*n f32 (checked above); alpha/beta are host f32 for a 32F compute type.
        unsafe {
            blas::gemm_ex(
                *blas_handle.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                a as *const _,
                a_type,
                k as i32,
                b as *const _,
                b_type,
                k as i32,
                (&beta as *const f32).cast(),
                c as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                n as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Cuda { op: "gemm", reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::Prefill;

    #[test]
    fn prefill_choice_follows_the_device() {
        let c = Prefill::choose;
        assert_eq!(
            (c(None, true, true), c(None, true, false), c(None, false, false)),
            (Prefill::F16, Prefill::Mmq, Prefill::Gemv)
        );
        assert_eq!((c(Some("f16"), true, true), c(Some("f32"), true, true)), (Prefill::F16, Prefill::F32));
        // A width the device cannot do falls back to what it can.
        assert_eq!((c(Some("f16"), true, false), c(Some("mmq"), false, true)), (Prefill::Mmq, Prefill::F16));
        assert_eq!((c(Some("other"), true, true), c(Some("mmq"), true, true)), (Prefill::F16, Prefill::Mmq));
    }
}
