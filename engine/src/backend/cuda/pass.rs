//! The start of a forward pass on the GPU: `CudaPass`, what the ops need to know about
//! the pass's rows (their KV plan, recurrent states and positions, GEMM or GEMV runs,
//! rotary tables), made by `begin` (or handed over by the graph code in a capture).

use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::device::drv;
use super::forward::CudaBackend;
use super::gemm::{Prefill, gemm_min_rows};
use super::graph::Step;
use super::hybrid::StateRows;
use super::kv::KvPlan;
use super::ops::ScaledRope;
use crate::backend::batch::{Logits, Row, Spans};
use crate::error::{Error, Result};
use crate::kernels::rope::RopeAngles;

pub struct CudaPass {
    pub(super) spans: Spans,
    /// Runs of stacked rows and whether they take the GEMM (a long sequence chunk) or
    /// the GEMV (decode rows, short chunks).
    pub(super) runs: Vec<(Range<usize>, bool)>,
    pub(super) ids: CudaSlice<i32>,
    pub(super) head_dim: usize,
    pub(super) bases: Vec<f32>,
    /// Each table's scaled terms (`begin_scaled`), `None` for plain angles.
    pub(super) scaled: Vec<Option<ScaledRope>>,
    pub(super) kv: KvPlan,
    /// In a capture: where `finish` leaves the logits (the step's buffer).
    pub(super) capture: Option<CudaSlice<f32>>,
    /// When `begin` was called (the host's queueing time is logged at the end).
    pub(super) started: std::time::Instant,
}

impl CudaPass {
    /// Where the pass's rows keep their recurrent states (`hybrid.rs`).
    pub(super) fn state_rows(&self) -> StateRows<'_> {
        StateRows { rec: &self.kv.rec, row_first: &self.kv.row_first }
    }
}

/// A speculative verify row (`[last token, draft…]`, every position's logits, at most
/// `MAX_DRAFT + 1` tokens): its matmuls stay on the GEMV and its attention runs as one
/// decode row per token, so each position's logits are those of a decode step there.
/// Prefill's kernels (tiled attention, the GEMM) sum in other orders.
fn verify_row(r: &Row<'_>) -> bool {
    r.logits == Logits::All && (2..=crate::speculate::policy::MAX_DRAFT + 1).contains(&r.tokens.len())
}

impl CudaBackend {
    /// `Backend::begin` with the attention's head size (which plans the prefill
    /// attention's query tiles) apart from the rotary tables' (`head_dim`; qwen35 rotates
    /// only part of each head, `Backend::rope_partial`).
    pub(super) fn begin_planned(
        &self,
        rows: &mut [Row<'_>],
        plan_head_dim: usize,
        head_dim: usize,
        rope_bases: &[f32],
    ) -> Result<CudaPass> {
        let started = std::time::Instant::now();
        let spans = Spans::of(rows);
        let captured = self.graphs.lock().unwrap_or_else(|e| e.into_inner()).take_capturing();
        let (ids, kv, capture) = match captured {
            // The step's buffers were filled before the capture began.
            Some(Step { ids, kv, logits }) => (ids, kv, Some(logits)),
            None => {
                let tokens: Vec<i32> = Spans::stack(rows).into_iter().map(|t| t as i32).collect();
                let per_token: Vec<bool> = rows.iter().map(verify_row).collect();
                let mut caches: Vec<_> = rows.iter_mut().map(|r| (&mut *r.cache, r.tokens.len())).collect();
                let kv = self.gpu.plan_kv_with(&mut caches, plan_head_dim, &per_token)?;
                (self.gpu.stream.clone_htod(&tokens).map_err(drv("upload tokens"))?, kv, None)
            }
        };
        let mut runs: Vec<(Range<usize>, bool)> = Vec::new();
        let prefill = self.gpu.prefill();
        for (&(at, n, _), row) in spans.each().iter().zip(rows.iter()) {
            let gemm = n >= gemm_min_rows() && prefill != Prefill::Gemv && !verify_row(row);
            // cuBLAS picks its algorithm by shape: one call per sequence's chunk, so a
            // row's sums do not depend on the other sequences of the pass.
            let joins = !gemm || prefill == Prefill::Mmq;
            match runs.last_mut() {
                Some((r, g)) if *g == gemm && joins && r.end == at => r.end = at + n,
                _ => runs.push((at..at + n, gemm)),
            }
        }
        if capture.is_some() && runs.iter().any(|r| r.1) {
            return Err(Error::Cuda { op: "capture", reason: "a decode step took the GEMM".into() });
        }
        let (bases, scaled) = (rope_bases.to_vec(), vec![None; rope_bases.len()]);
        Ok(CudaPass { spans, runs, ids, head_dim, bases, scaled, kv, capture, started })
    }

    /// `Backend::begin_partial` (`begin_scaled` when the heads are the tables' size).
    pub(super) fn begin_tables(
        &self,
        rows: &mut [Row<'_>],
        plan_head_dim: usize,
        ropes: &[RopeAngles<'_>],
    ) -> Result<CudaPass> {
        let head_dim = ropes.first().map_or(0, |r| r.head_dim);
        if ropes.iter().any(|r| r.head_dim != head_dim) {
            return Err(Error::Cuda { op: "begin", reason: "rotary tables of different head sizes".into() });
        }
        // The tables before `begin`: a capture that cannot have one must fail while its
        // step is still the graph code's (`begin` takes it).
        let capturing = self.graphs.lock().unwrap_or_else(|e| e.into_inner()).is_capturing();
        let scaled = ropes.iter().map(|a| self.ropes.get(&self.gpu, a, capturing)).collect::<Result<Vec<_>>>()?;
        let bases: Vec<f32> = ropes.iter().map(|r| r.base).collect();
        let mut p = self.begin_planned(rows, plan_head_dim, head_dim, &bases)?;
        for (s, t) in p.scaled.iter_mut().zip(scaled) {
            *s = t;
        }
        Ok(p)
    }
}
