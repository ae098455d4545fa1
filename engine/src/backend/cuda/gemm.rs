//! Prefill matmuls through cuBLAS, on the values the CPU multiplies: the weights
//! dequantized to f32 (ggml's dequantization, exact), the activations quantized to int8
//! blocks as the CPU quantizes them and expanded back to f32 (exact), then one f32 GEMM
//! (no TF32). So the GEMM differs from the CPU's int8 dot products only in the order of
//! f32 additions. Used for a sequence's chunk of at least `gemm_min_rows()` tokens (where
//! the GEMV kernel would re-read the weights every 8 rows); decode rows always take the
//! GEMV, so a decoding row's arithmetic never depends on the rows it is batched with.

use std::ops::Range;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::ops::DeviceAct;
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

impl Gpu {
    /// Whether cuBLAS is loaded (else every matmul takes the GEMV kernel).
    pub fn has_gemm(&self) -> bool {
        self.blas.is_some()
    }

    /// `w` dequantized to f32, `[n][k]`.
    pub(crate) fn dequant_f32(&self, w: &DeviceWeights) -> Result<CudaSlice<f32>> {
        // SAFETY: f32 has no invalid bit patterns; the kernel writes all n*k values.
        let mut out = unsafe { self.stream.alloc::<f32>(w.n * w.k) }.map_err(drv("alloc f32 weights"))?;
        let f = self.function(&EMBED, "dequant_f32")?;
        let ty = super::ops::type_index(w.dtype)? as i32;
        let cfg = LaunchConfig { grid_dim: (w.n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let k = w.k as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux).arg(&mut out).arg(&k).arg(&ty);
        // SAFETY: the weights hold n rows of k values in the layout the kernel reads.
        unsafe { b.launch(cfg) }.map_err(drv("dequant_f32"))?;
        Ok(out)
    }

    /// Quantized activations expanded back to f32 (`[rows][k]`).
    pub(crate) fn dequant_act(&self, act: &DeviceAct) -> Result<CudaSlice<f32>> {
        let n = act.rows * act.k;
        // SAFETY: as above; the kernel writes all n values.
        let mut out = unsafe { self.stream.alloc::<f32>(n) }.map_err(drv("alloc f32 activations"))?;
        let f = self.function(&EMBED, "dequant_act")?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ni, block) = (n as i32, act.format.block() as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&act.qs).arg(&act.d).arg(&mut out).arg(&ni).arg(&block);
        // SAFETY: qs holds n values, d one per block of them.
        unsafe { b.launch(cfg) }.map_err(drv("dequant_act"))?;
        Ok(out)
    }

    /// `y[r] = wh . xh[r]` for rows `rows` (`wh` is `[n][k]`, `xh` `[*][k]`, `y` `[*][n]`).
    pub(crate) fn gemm_rows(
        &self,
        wh: &CudaSlice<f32>,
        (n, k): (usize, usize),
        xh: &CudaSlice<f32>,
        rows: Range<usize>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let blas_handle =
            self.blas.as_ref().ok_or_else(|| Error::Cuda { op: "gemm", reason: "cuBLAS not loaded".into() })?;
        if wh.len() != n * k || xh.len() < rows.end * k || y.len() < rows.end * n {
            return Err(Error::Cuda { op: "gemm", reason: "shape mismatch".into() });
        }
        let m = rows.len();
        if m == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (a, _) = wh.device_ptr(&self.stream);
        let (b, _) = xh.device_ptr(&self.stream);
        let (c, _) = y.device_ptr_mut(&self.stream);
        let (b, c) = (b + (rows.start * k * 4) as u64, c + (rows.start * n * 4) as u64);
        // Column-major view: y^T (n x m) = W (stored [n][k], i.e. k x n, transposed) x
        // x^T (stored [m][k], i.e. k x m).
        // SAFETY: a holds n*k f32, b from row `rows.start` holds m*k, c from that row
        // holds m*n (checked above); alpha/beta are host f32 for a 32F compute type.
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
                blas_sys::cudaDataType_t::CUDA_R_32F,
                k as i32,
                b as *const _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
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
