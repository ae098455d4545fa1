//! Prefill matmuls on the tensor cores (`kernels/mmq.cu`): the quantized weights and the
//! int8 activations go straight into int8 `mma.sync`, whose block sums are exact, and
//! each block is scaled in f32 as the GEMV scales it. No dequantized copy of the weights
//! is made. One of the ways a sequence's chunk of at least `gemm_min_rows()` tokens is
//! multiplied (`gemm::Prefill`).

use std::ops::Range;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::formats::type_index;
use super::ops::{ActFormat, DeviceAct};
use super::programs::MMQ;
use super::weights::DeviceWeights;
use crate::error::{Error, Result};
use crate::gguf::Stored;

/// Weight rows and activation rows one CTA covers (`mmq.cu`).
const TILE: usize = 64;

/// The MMQ kernels: the first six of `KERNEL_TYPES`. The other formats have none; their
/// long chunks take the GEMV when prefill is MMQ (`runs.rs`).
const MMQ_KERNELS: [&str; 6] = ["mmq_q4_0", "mmq_q4_1", "mmq_q5_0", "mmq_q8_0", "mmq_q4_k", "mmq_q6_k"];

/// Whether `mmq_rows` has a kernel for weights of `dtype`.
pub(crate) fn has_mmq_kernel(dtype: Stored) -> bool {
    type_index(dtype).is_ok_and(|t| t < MMQ_KERNELS.len())
}

impl Gpu {
    /// Whether the device has int8 `mma.sync` for the MMQ kernel (compute capability
    /// 8.0 or later).
    pub fn has_mmq(&self) -> bool {
        let cc = self.arch().trim_start_matches("sm_").trim_end_matches(char::is_alphabetic).parse::<u32>();
        cc.is_ok_and(|v| v >= 80)
    }

    /// `y[r][j] = W[j] . x[r]` for rows `rows` of `act` (quantized for `w`) into the same
    /// rows of `y` (`[*][w.n]`).
    pub fn mmq_rows(
        &self,
        w: &DeviceWeights,
        act: &DeviceAct,
        y: &mut CudaSlice<f32>,
        rows: Range<usize>,
    ) -> Result<()> {
        let bad = |reason: String| Error::Cuda { op: "mmq", reason };
        if ActFormat::for_weights(w.dtype) != Some(act.format) || act.k != w.k {
            return Err(bad(format!("{:?} weights with {:?} activations of k {}", w.dtype, act.format, act.k)));
        }
        if rows.end > act.rows || y.len() < act.rows * w.n {
            return Err(bad(format!("rows {rows:?} of {}, y {} values", act.rows, y.len())));
        }
        let m = rows.len();
        if m == 0 {
            return Ok(());
        }
        let name = MMQ_KERNELS
            .get(type_index(w.dtype)?)
            .ok_or_else(|| bad(format!("no MMQ kernel for {:?} (`has_mmq_kernel`)", w.dtype)))?;
        let f = self.function(&MMQ, name)?;
        let kb = w.k / act.format.block();
        let int = |v: usize| i32::try_from(v).map_err(|_| bad(format!("{v} exceeds i32")));
        let (n, kbi, mi) = (int(w.n)?, int(kb)?, int(m)?);
        let cfg = LaunchConfig {
            grid_dim: (int(w.n.div_ceil(TILE))? as u32, int(m.div_ceil(TILE))? as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let r0 = rows.start;
        let a = act.rows_from(r0);
        let mut yv = y.slice_mut(r0 * w.n..);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux);
        a.push(&mut b);
        b.arg(&mut yv).arg(&n).arg(&kbi).arg(&mi);
        // SAFETY: the weights hold n rows of kb blocks in the layout the kernel reads;
        // the activation views start at row r0 and hold m rows; y holds m*n from r0*n.
        // Out-of-range lanes read the last valid row and store nothing.
        unsafe { b.launch(cfg) }.map_err(drv("mmq"))?;
        Ok(())
    }
}
