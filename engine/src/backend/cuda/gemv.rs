//! Host side of the quantized GEMV (`kernels/gemv.cu`): decode rows and short chunks
//! against quantized weights, up to `GEMV_MAX_ROWS` activation rows per launch, the
//! weights read once for all of them; two or three matrices of one format against the
//! same activations share a launch (`gemv_many`).
//!
//! Kernels: a launch of one activation row (a decode step of one sequence) takes
//! `gemv1_<type>` / `gemv1x3_<type>`, which issue a lane's weight loads together before
//! their sums; launches of 2 to 8 rows take `gemv_<type>` / `gemv3_<type>`. At one row
//! both give bit-identical outputs (same items, order and arithmetic; tested), so which
//! one a row gets never changes its result.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};

use super::device::{Gpu, drv};
use super::formats::type_index;
use super::ops::{ActFormat, DeviceAct, GEMV_MAX_ROWS, blocks_of, int, shape};
use super::programs::GEMV;
use super::weights::DeviceWeights;
use crate::error::Result;

// Kernel names in `KERNEL_TYPES` order.
const ONE: [&str; 15] = [
    "gemv1_q4_0",
    "gemv1_q4_1",
    "gemv1_q5_0",
    "gemv1_q8_0",
    "gemv1_q4_k",
    "gemv1_q6_k",
    "gemv1_q5_1",
    "gemv1_iq4_nl",
    "gemv1_q5_k",
    "gemv1_q3_k",
    "gemv1_q2_k",
    "gemv1_iq4_xs",
    "gemv1_f16",
    "gemv1_bf16",
    "gemv1_mxfp4",
];
const ONE_X3: [&str; 15] = [
    "gemv1x3_q4_0",
    "gemv1x3_q4_1",
    "gemv1x3_q5_0",
    "gemv1x3_q8_0",
    "gemv1x3_q4_k",
    "gemv1x3_q6_k",
    "gemv1x3_q5_1",
    "gemv1x3_iq4_nl",
    "gemv1x3_q5_k",
    "gemv1x3_q3_k",
    "gemv1x3_q2_k",
    "gemv1x3_iq4_xs",
    "gemv1x3_f16",
    "gemv1x3_bf16",
    "gemv1x3_mxfp4",
];
const ROWS: [&str; 15] = [
    "gemv_q4_0",
    "gemv_q4_1",
    "gemv_q5_0",
    "gemv_q8_0",
    "gemv_q4_k",
    "gemv_q6_k",
    "gemv_q5_1",
    "gemv_iq4_nl",
    "gemv_q5_k",
    "gemv_q3_k",
    "gemv_q2_k",
    "gemv_iq4_xs",
    "gemv_f16",
    "gemv_bf16",
    "gemv_mxfp4",
];
const ROWS_X3: [&str; 15] = [
    "gemv3_q4_0",
    "gemv3_q4_1",
    "gemv3_q5_0",
    "gemv3_q8_0",
    "gemv3_q4_k",
    "gemv3_q6_k",
    "gemv3_q5_1",
    "gemv3_iq4_nl",
    "gemv3_q5_k",
    "gemv3_q3_k",
    "gemv3_q2_k",
    "gemv3_iq4_xs",
    "gemv3_f16",
    "gemv3_bf16",
    "gemv3_mxfp4",
];

/// One matrix of a `gemv3` launch (`Mat` in `gemv.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Mat {
    qs: u64,
    d: u64,
    m: u64,
    aux: u64,
    y: u64,
    bias: u64,
    n: i32,
}

// SAFETY: plain integers laid out as the kernel's `Mat` (six pointers and an int).
unsafe impl cudarc::driver::DeviceRepr for Mat {}

impl Mat {
    fn of(w: &DeviceWeights, y: u64, s: &cudarc::driver::CudaStream) -> Result<Self> {
        let p = |b: &CudaSlice<u8>| b.device_ptr(s).0;
        let f = |b: &CudaSlice<f32>| b.device_ptr(s).0;
        Ok(Self { qs: p(&w.qs), d: f(&w.d), m: f(&w.m), aux: p(&w.aux), y, bias: w.bias_ptr(s), n: int(w.n)? })
    }
}

impl Gpu {
    /// `y[r][j] = W[j] . x[r]` for every row of `act` (already quantized for `w`);
    /// `y` is `[act.rows, w.n]`.
    pub fn gemv(&self, w: &DeviceWeights, act: &DeviceAct, y: &mut CudaSlice<f32>) -> Result<()> {
        self.gemv_rows(w, act, y, 0..act.rows)
    }

    /// `gemv` for rows `rows` of `act` only (into the same rows of `y`).
    pub fn gemv_rows(
        &self,
        w: &DeviceWeights,
        act: &DeviceAct,
        y: &mut CudaSlice<f32>,
        rows: std::ops::Range<usize>,
    ) -> Result<()> {
        self.gemv_rows_as(false, w, act, y, rows)
    }

    /// `gemv_rows`, launches of one row on the several-row kernel too if `multi`.
    pub(crate) fn gemv_rows_as(
        &self,
        multi: bool,
        w: &DeviceWeights,
        act: &DeviceAct,
        y: &mut CudaSlice<f32>,
        rows: std::ops::Range<usize>,
    ) -> Result<()> {
        shape(rows.end <= act.rows, || format!("rows {rows:?} of {}", act.rows))?;
        let want = ActFormat::for_weights(w.dtype);
        shape(want == Some(act.format), || {
            format!("{:?} weights need {want:?} activations, got {:?}", w.dtype, act.format)
        })?;
        shape(act.k == w.k, || format!("activations have k = {}, weights {}", act.k, w.k))?;
        shape(y.len() >= act.rows * w.n, || format!("y has {} values, need {}", y.len(), act.rows * w.n))?;
        let t = type_index(w.dtype)?;
        // Blocks of activation scales a row: the GEMV's `kb` (values for the float formats).
        let kb = w.k / act.format.block();
        let (n, kbi) = (int(w.n)?, int(kb)?);
        const WARPS: usize = 4;
        let cfg = blocks_of(w.n * 32, WARPS * 32)?;
        let bias = w.bias_ptr(&self.stream);
        let mut r0 = rows.start;
        while r0 < rows.end {
            let chunk = (rows.end - r0).min(GEMV_MAX_ROWS);
            let ri = int(chunk)?;
            let one = chunk == 1 && !multi;
            let f = self.function(&GEMV, if one { ONE[t] } else { ROWS[t] })?;
            let a = act.rows_from(r0);
            let mut yv = y.slice_mut(r0 * w.n..);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux);
            a.push(&mut b);
            b.arg(&mut yv).arg(&bias).arg(&n).arg(&kbi);
            if !one {
                b.arg(&ri);
            }
            // SAFETY: weights hold n*kb blocks in the layout the kernel reads; the views
            // start at row r0 and hold `chunk` rows; y holds chunk*n from r0*n.
            unsafe { b.launch(cfg) }.map_err(drv("gemv"))?;
            r0 += chunk;
        }
        Ok(())
    }

    /// `gemv_rows` for two or three matrices of one format (and width) against the same
    /// activations, in one launch per 8 rows; `ys[i]` is `[act.rows, ws[i].n]`.
    pub fn gemv_many(
        &self,
        ws: &[&DeviceWeights],
        act: &DeviceAct,
        ys: &mut [CudaSlice<f32>],
        rows: std::ops::Range<usize>,
    ) -> Result<()> {
        self.gemv_many_as(false, ws, act, ys, rows)
    }

    /// `gemv_many`, launches of one row on the several-row kernel too if `multi`.
    pub(crate) fn gemv_many_as(
        &self,
        multi: bool,
        ws: &[&DeviceWeights],
        act: &DeviceAct,
        ys: &mut [CudaSlice<f32>],
        rows: std::ops::Range<usize>,
    ) -> Result<()> {
        shape((2..=3).contains(&ws.len()) && ys.len() == ws.len(), || format!("{} matrices", ws.len()))?;
        let w0 = ws[0];
        shape(ws.iter().all(|w| w.dtype == w0.dtype && w.k == w0.k), || "matrices of mixed formats".into())?;
        shape(ActFormat::for_weights(w0.dtype) == Some(act.format) && act.k == w0.k, || {
            format!("{:?} weights with {:?} activations", w0.dtype, act.format)
        })?;
        shape(rows.end <= act.rows, || format!("rows {rows:?} of {}", act.rows))?;
        for (w, y) in ws.iter().zip(ys.iter()) {
            shape(y.len() >= act.rows * w.n, || format!("y has {} values, need {}", y.len(), act.rows * w.n))?;
        }
        let t = type_index(w0.dtype)?;
        let kb = w0.k / act.format.block();
        let kbi = int(kb)?;
        let total: usize = ws.iter().map(|w| w.n).sum();
        let cfg = blocks_of(total * 32, 4 * 32)?;
        let mut mats = Vec::with_capacity(3);
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            let (yp, _) = y.device_ptr_mut(&self.stream);
            mats.push(Mat::of(w, yp, &self.stream)?);
        }
        // A third matrix of no rows when there are two: no warp selects it.
        let last = Mat { n: 0, ..mats[mats.len() - 1] };
        mats.resize(3, last);
        let mut r0 = rows.start;
        while r0 < rows.end {
            let chunk = (rows.end - r0).min(GEMV_MAX_ROWS);
            let ri = int(chunk)?;
            let one = chunk == 1 && !multi;
            let f = self.function(&GEMV, if one { ONE_X3[t] } else { ROWS_X3[t] })?;
            let shifted: Vec<Mat> =
                mats.iter().map(|m| Mat { y: m.y + (r0 * m.n as usize * 4) as u64, ..*m }).collect();
            let a = act.rows_from(r0);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&shifted[0]).arg(&shifted[1]).arg(&shifted[2]);
            a.push(&mut b);
            b.arg(&kbi);
            if !one {
                b.arg(&ri);
            }
            // SAFETY: each Mat points at weights of n rows of kb blocks and at an output
            // holding `chunk` rows of n from row r0 (checked above); the activation views
            // start at row r0 and hold `chunk` rows.
            unsafe { b.launch(cfg) }.map_err(drv("gemv3"))?;
            r0 += chunk;
        }
        Ok(())
    }
}
