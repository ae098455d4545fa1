//! The CUDA backend's matmuls, run by run of a pass's rows: decode rows and short chunks
//! on the GEMV, long chunks on the MMQ kernel or cuBLAS (`gemm::Prefill`), the input
//! quantized once per activation format the matrices need.

use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::forward::CudaBackend;
use super::gemm::{Prefill, Wide};
use super::mmq::has_mmq_kernel;
use super::ops::{ActFormat, DeviceAct};
use super::weights::DeviceWeights;
use crate::error::{Error, Result};

impl CudaBackend {
    pub(super) fn act_format(w: &DeviceWeights) -> Result<ActFormat> {
        ActFormat::for_weights(w.dtype)
            .ok_or_else(|| Error::Cuda { op: "matmul", reason: format!("no CUDA kernel for {:?}", w.dtype) })
    }

    /// `x W^T` for each matrix, run by run of rows (see `matmul_acts`), `x` quantized
    /// once per weight format.
    pub(super) fn matmul_runs<const N: usize>(
        &self,
        runs: &[(Range<usize>, bool)],
        w: [&DeviceWeights; N],
        x: &CudaSlice<f32>,
    ) -> Result<[CudaSlice<f32>; N]> {
        let acts = self.acts_for(runs, &w, x.len() / w[0].k, |a| self.gpu.quantize(x, a))?;
        self.matmul_acts(runs, w, &acts)
    }

    /// Whether the pass's GEMM runs go to cuBLAS.
    pub(super) fn cublas_runs(&self, runs: &[(Range<usize>, bool)]) -> bool {
        runs.iter().any(|r| r.1) && self.gpu.prefill().cublas()
    }

    /// One quantized copy of the `m` input rows per activation format the matrices need,
    /// made by `fill`; with cuBLAS GEMM runs, also widened for it.
    pub(super) fn acts_for(
        &self,
        runs: &[(Range<usize>, bool)],
        w: &[&DeviceWeights],
        m: usize,
        mut fill: impl FnMut(&mut DeviceAct) -> Result<()>,
    ) -> Result<Vec<(DeviceAct, Option<Wide>)>> {
        let mut acts: Vec<(DeviceAct, Option<Wide>)> = Vec::new();
        for wi in w {
            let format = Self::act_format(wi)?;
            if !acts.iter().any(|a| a.0.format == format) {
                let mut a = DeviceAct::alloc(&self.gpu, format, m, wi.k)?;
                fill(&mut a)?;
                let prefill = self.gpu.prefill();
                let wide = if self.cublas_runs(runs) { Some(self.gpu.dequant_act_wide(&a, prefill)?) } else { None };
                acts.push((a, wide));
            }
        }
        Ok(acts)
    }

    /// `x W^T` for each matrix from its quantized input (`acts_for`), run by run of rows:
    /// GEMV runs (matrices of one format share launches), and GEMM runs on MMQ or on
    /// cuBLAS with the widened copy.
    pub(super) fn matmul_acts<const N: usize>(
        &self,
        runs: &[(Range<usize>, bool)],
        w: [&DeviceWeights; N],
        acts: &[(DeviceAct, Option<Wide>)],
    ) -> Result<[CudaSlice<f32>; N]> {
        let act_for = |wi: &DeviceWeights| {
            acts.iter().find(|a| Some(a.0.format) == ActFormat::for_weights(wi.dtype)).unwrap_or(&acts[0])
        };
        let m = acts[0].0.rows;
        let mut out = w.iter().map(|wi| self.alloc(m * wi.n)).collect::<Result<Vec<_>>>()?;
        let together = (2..=3).contains(&N) && w.iter().all(|wi| wi.dtype == w[0].dtype);
        for (rows, _) in runs.iter().filter(|r| !r.1) {
            if together {
                self.gpu.gemv_many(&w, &act_for(w[0]).0, &mut out, rows.clone())?;
            } else {
                for (wi, y) in w.iter().zip(out.iter_mut()) {
                    self.gpu.gemv_rows(wi, &act_for(wi).0, y, rows.clone())?;
                }
            }
        }
        let prefill = self.gpu.prefill();
        let mmq = runs.iter().any(|r| r.1) && prefill == Prefill::Mmq;
        for (wi, y) in w.iter().zip(out.iter_mut()) {
            let (act, wide) = act_for(wi);
            if mmq && has_mmq_kernel(wi.dtype) {
                for (rows, _) in runs.iter().filter(|r| r.1) {
                    self.gpu.mmq_rows(wi, act, y, rows.clone())?;
                    self.add_bias_rows(wi, y, rows)?;
                }
            } else if mmq {
                // A format without an MMQ kernel: its long chunks on the GEMV, 8 rows a launch.
                for (rows, _) in runs.iter().filter(|r| r.1) {
                    self.gpu.gemv_rows(wi, act, y, rows.clone())?;
                }
            } else if let Some(xw) = wide {
                let ww = self.gpu.dequant_wide(wi, prefill)?;
                for (rows, _) in runs.iter().filter(|r| r.1) {
                    self.gpu.gemm_rows(&ww, (wi.n, wi.k), xw, rows.clone(), y)?;
                    self.add_bias_rows(wi, y, rows)?;
                }
            }
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one output per matrix")))
    }

    /// A GEMM run's outputs plus the matrix's bias (the GEMV adds it as it writes).
    fn add_bias_rows(&self, w: &DeviceWeights, y: &mut CudaSlice<f32>, rows: &Range<usize>) -> Result<()> {
        match &w.bias {
            Some(b) => self.gpu.add_rows(&mut y.slice_mut(rows.start * w.n..rows.end * w.n), b),
            None => Ok(()),
        }
    }
}
