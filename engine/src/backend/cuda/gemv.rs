//! Host side of the quantized GEMV (`kernels/gemv.cu`): decode rows and short chunks
//! against quantized weights, up to `GEMV_MAX_ROWS` activation rows per launch, the
//! weights read once for all of them; two or three matrices of one format against the
//! same activations share a launch (`gemv_many`).
//!
//! Kernels: `gemvm_<type>_<M>` take M = 1, 2, 4 or 8 activation rows as a template
//! parameter (the launch uses the smallest M that holds its rows), so their accumulators
//! live in registers and a lane's weight loads are issued together. `gemv_<type>` is the
//! earlier form (run-time row count); `CORRAL_CUDA_GEMV=legacy` selects it, for A/B.
//! Both give bit-identical outputs (same items, order and arithmetic; tested).

use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};

use super::device::{Gpu, drv};
use super::ops::{ActFormat, DeviceAct, GEMV_MAX_ROWS, blocks_of, int, shape, type_index};
use super::programs::{GEMV, GEMV_ROWS, Program};
use super::weights::DeviceWeights;
use crate::error::Result;

/// Which GEMV kernels launch: 0 unset (read `CORRAL_CUDA_GEMV` on first use),
/// 1 the templated ones, 2 the legacy ones.
static VARIANT: AtomicU8 = AtomicU8::new(0);

/// Whether the legacy (run-time row count) kernels are selected.
fn legacy() -> bool {
    let mut v = VARIANT.load(Ordering::Relaxed);
    if v == 0 {
        v = if std::env::var("CORRAL_CUDA_GEMV").as_deref() == Ok("legacy") { 2 } else { 1 };
        VARIANT.store(v, Ordering::Relaxed);
    }
    v == 2
}

/// The program and kernel for format `t` (`type_index`) and a launch of `rows`
/// activation rows.
fn kernel_name(legacy: bool, many: bool, t: usize, rows: usize) -> (&'static Program, &'static str) {
    static ONE: [[&str; 5]; 6] = names::<false>();
    static MANY: [[&str; 5]; 6] = names::<true>();
    let m = if legacy {
        0
    } else {
        match rows {
            0..=1 => 1,
            2 => 2,
            3..=4 => 3,
            _ => 4,
        }
    };
    let program = if m > 1 { &GEMV_ROWS } else { &GEMV };
    (program, if many { MANY[t][m] } else { ONE[t][m] })
}

/// `[type][legacy, M = 1, 2, 4, 8]` kernel names.
const fn names<const MANY: bool>() -> [[&'static str; 5]; 6] {
    macro_rules! row {
        ($t:literal) => {
            if MANY {
                [
                    concat!("gemv3_", $t),
                    concat!("gemvm3_", $t, "_1"),
                    concat!("gemvm3_", $t, "_2"),
                    concat!("gemvm3_", $t, "_4"),
                    concat!("gemvm3_", $t, "_8"),
                ]
            } else {
                [
                    concat!("gemv_", $t),
                    concat!("gemvm_", $t, "_1"),
                    concat!("gemvm_", $t, "_2"),
                    concat!("gemvm_", $t, "_4"),
                    concat!("gemvm_", $t, "_8"),
                ]
            }
        };
    }
    [row!("q4_0"), row!("q4_1"), row!("q5_0"), row!("q8_0"), row!("q4_k"), row!("q6_k")]
}

/// One matrix of a `gemv3` launch (`Mat` in `gemv.cu`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Mat {
    qs: u64,
    d: u64,
    m: u64,
    aux: u64,
    y: u64,
    n: i32,
}

// SAFETY: plain integers laid out as the kernel's `Mat` (five pointers and an int).
unsafe impl cudarc::driver::DeviceRepr for Mat {}

impl Mat {
    fn of(w: &DeviceWeights, y: u64, s: &cudarc::driver::CudaStream) -> Result<Self> {
        let p = |b: &CudaSlice<u8>| b.device_ptr(s).0;
        let f = |b: &CudaSlice<f32>| b.device_ptr(s).0;
        Ok(Self { qs: p(&w.qs), d: f(&w.d), m: f(&w.m), aux: p(&w.aux), y, n: int(w.n)? })
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
        self.gemv_rows_as(legacy(), w, act, y, rows)
    }

    /// `gemv_rows` on the legacy kernels (`legacy`) or the templated ones.
    pub(crate) fn gemv_rows_as(
        &self,
        legacy: bool,
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
        let bs = act.format.block();
        let kb = w.k / bs;
        let (n, kbi) = (int(w.n)?, int(kb)?);
        const WARPS: usize = 4;
        let cfg = blocks_of(w.n * 32, WARPS * 32)?;
        let mut r0 = rows.start;
        while r0 < rows.end {
            let chunk = (rows.end - r0).min(GEMV_MAX_ROWS);
            let ri = int(chunk)?;
            let f = {
                let (p, name) = kernel_name(legacy, false, t, chunk);
                self.function(p, name)?
            };
            let a = act.rows_from(r0);
            let mut yv = y.slice_mut(r0 * w.n..);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux);
            a.push(&mut b);
            b.arg(&mut yv).arg(&n).arg(&kbi).arg(&ri);
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
        self.gemv_many_as(legacy(), ws, act, ys, rows)
    }

    /// `gemv_many` on the legacy kernels (`legacy`) or the templated ones.
    pub(crate) fn gemv_many_as(
        &self,
        legacy: bool,
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
            let f = {
                let (p, name) = kernel_name(legacy, true, t, chunk);
                self.function(p, name)?
            };
            let shifted: Vec<Mat> =
                mats.iter().map(|m| Mat { y: m.y + (r0 * m.n as usize * 4) as u64, ..*m }).collect();
            let a = act.rows_from(r0);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&shifted[0]).arg(&shifted[1]).arg(&shifted[2]);
            a.push(&mut b);
            b.arg(&kbi).arg(&ri);
            // SAFETY: each Mat points at weights of n rows of kb blocks and at an output
            // holding `chunk` rows of n from row r0 (checked above); the activation views
            // start at row r0 and hold `chunk` rows.
            unsafe { b.launch(cfg) }.map_err(drv("gemv3"))?;
            r0 += chunk;
        }
        Ok(())
    }
}
