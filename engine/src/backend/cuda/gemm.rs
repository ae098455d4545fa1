//! Prefill matmuls through cuBLAS: the weight matrix dequantized to f16 (ggml's
//! dequantization), the activations rounded to f16, one f16 x f16 -> f32 GEMM. Used for
//! a sequence's chunk of at least `GEMM_MIN_ROWS` tokens (where the GEMV kernel would
//! re-read the weights every 8 rows); decode rows always take the int8 GEMV, so a
//! decoding row's arithmetic never depends on the rows it is batched with.

use std::ops::Range;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::f16;

use super::device::{Gpu, drv};
use super::programs::EMBED;
use super::weights::DeviceWeights;
use crate::error::{Error, Result};

/// A sequence's chunk takes the GEMM from this many rows.
pub const GEMM_MIN_ROWS: usize = 32;

impl Gpu {
    /// Whether cuBLAS is loaded (else every matmul takes the GEMV kernel).
    pub fn has_gemm(&self) -> bool {
        self.blas.is_some()
    }

    /// `w` dequantized to f16, `[n][k]`.
    pub(crate) fn dequant_f16(&self, w: &DeviceWeights) -> Result<CudaSlice<f16>> {
        // SAFETY: f16 has no invalid bit patterns; the kernel writes all n*k values.
        let mut out = unsafe { self.stream.alloc::<f16>(w.n * w.k) }.map_err(drv("alloc f16 weights"))?;
        let f = self.function(&EMBED, "dequant_f16")?;
        let ty = super::ops::type_index(w.dtype)? as i32;
        let cfg = LaunchConfig { grid_dim: (w.n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let k = w.k as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux).arg(&mut out).arg(&k).arg(&ty);
        // SAFETY: the weights hold n rows of k values in the layout the kernel reads.
        unsafe { b.launch(cfg) }.map_err(drv("dequant_f16"))?;
        Ok(out)
    }

    /// `x` rounded to f16.
    pub(crate) fn to_f16(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<f16>> {
        let n = x.len();
        // SAFETY: as above; the kernel writes all n values.
        let mut out = unsafe { self.stream.alloc::<f16>(n) }.map_err(drv("alloc f16 activations"))?;
        let f = self.function(&EMBED, "to_f16")?;
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let ni = n as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&mut out).arg(&ni);
        // SAFETY: n values in both.
        unsafe { b.launch(cfg) }.map_err(drv("to_f16"))?;
        Ok(out)
    }

    /// `y[r] = wh . xh[r]` for rows `rows` (`wh` is `[n][k]` f16, `xh` `[*][k]` f16, `y`
    /// `[*][n]` f32).
    pub(crate) fn gemm_rows(
        &self,
        wh: &CudaSlice<f16>,
        (n, k): (usize, usize),
        xh: &CudaSlice<f16>,
        rows: Range<usize>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let blas_handle = self.blas.as_ref().ok_or_else(|| Error::Cuda { op: "gemm", reason: "cuBLAS not loaded".into() })?;
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
        let (b, c) = (b + (rows.start * k * 2) as u64, c + (rows.start * n * 4) as u64);
        // Column-major view: y^T (n x m) = W (stored [n][k], i.e. k x n, transposed) x
        // x^T (stored [m][k], i.e. k x m).
        // SAFETY: a holds n*k f16, b from row `rows.start` holds m*k f16, c from that row
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
                blas_sys::cudaDataType_t::CUDA_R_16F,
                k as i32,
                b as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
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
