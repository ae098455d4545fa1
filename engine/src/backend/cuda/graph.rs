//! Decode steps as CUDA graphs. A pass whose rows each run one token and want its
//! logits — a decode step of B rows — launches the same kernels with the same shapes
//! and buffer addresses every time; only the token ids, positions and KV addresses
//! change, and the kernels read those from device buffers. So the first step of B rows
//! is captured (the model's forward runs with the stream in capture mode: its ops are
//! recorded, nothing executes) and every later one replays the graph: five small
//! uploads, one launch, one download. That takes ~20 kernel launches and ~25 buffer
//! allocations per layer off the host's critical path.
//!
//! The step's inputs and outputs (`Step`: token ids, KV plan, K/V staging, logits)
//! are allocated outside the graph and kept with it; every intermediate activation is
//! allocated and freed inside the graph. A replay runs exactly the captured kernels, so
//! its logits are bit-identical to the eager pass (tested). A capture that fails turns
//! graphs off for the model, with one log line, and the step runs eagerly.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::device::{Gpu, drv};
use super::kv::KvPlan;
use crate::backend::batch::{Logits, Row, Spans, split};
use crate::error::Result;

/// Most rows a captured step takes (one graph per row count, two once rows pass
/// `attention::SPLIT_MIN` positions).
pub(crate) const MAX_GRAPH_ROWS: usize = 32;

/// A decode step's device inputs and outputs, at fixed addresses.
pub(crate) struct Step {
    pub(crate) ids: CudaSlice<i32>,
    pub(crate) kv: KvPlan,
    /// `[rows][vocab]`, written by the graph's last op.
    pub(crate) logits: CudaSlice<f32>,
}

struct Slot {
    step: Step,
    graph: OwnedGraph,
}

/// A captured graph, owned by one model's `Graphs`.
struct OwnedGraph(cudarc::driver::CudaGraph);

// SAFETY: CUDA requires calls on one graph to be serialized, not made from one thread;
// an `OwnedGraph` is only reached through the `Mutex<Graphs>` or after being removed
// from it by the one caller that launches it.
unsafe impl Send for OwnedGraph {}

/// One model's captured decode steps, by row count and whether a row may need split
/// attention (`PlanHost::long`: the split launches are part of the graph).
#[derive(Default)]
pub(crate) struct Graphs {
    slots: HashMap<(usize, bool), Slot>,
    /// The step being captured: `begin` takes it, `finish` hands it back.
    capturing: Option<Step>,
    captured: Option<Step>,
    off: bool,
}

impl Graphs {
    pub(crate) fn new(on: bool) -> Mutex<Self> {
        Mutex::new(Self { off: !on, ..Self::default() })
    }

    pub(crate) fn set(&mut self, on: bool) {
        self.off = !on;
        if !on {
            self.slots.clear();
        }
    }

    /// Whether a decode step is being recorded (its step not yet taken by `begin`).
    pub(crate) fn is_capturing(&self) -> bool {
        self.capturing.is_some()
    }

    /// In a capture: the step `begin` should use instead of allocating.
    pub(crate) fn take_capturing(&mut self) -> Option<Step> {
        self.capturing.take()
    }

    /// From `finish` in a capture: the step, its logits copied in.
    pub(crate) fn put_captured(&mut self, step: Step) {
        self.captured = Some(step);
    }
}

/// `CORRAL_CUDA_GRAPHS=0` turns decode graphs off (every pass runs eagerly).
pub(crate) fn graphs_wanted() -> bool {
    std::env::var("CORRAL_CUDA_GRAPHS").map_or(true, |v| v != "0")
}

/// Whether a pass over `rows` is a decode step a graph can run.
pub(crate) fn decode_shaped(rows: &[Row<'_>]) -> bool {
    (1..=MAX_GRAPH_ROWS).contains(&rows.len()) && rows.iter().all(|r| r.tokens.len() == 1 && r.logits != Logits::None)
}

impl Gpu {
    /// Run one pass over `rows`: a decode step through its graph (captured on first
    /// use, with `forward` as the recording), anything else by `forward` itself.
    pub(crate) fn step<F>(
        &self,
        graphs: &Mutex<Graphs>,
        vocab: usize,
        rows: &mut [Row<'_>],
        mut forward: F,
    ) -> Result<Vec<Vec<f32>>>
    where
        F: FnMut(&mut [Row<'_>]) -> Result<Vec<Vec<f32>>>,
    {
        let lock = || graphs.lock().unwrap_or_else(|e| e.into_inner());
        if !decode_shaped(rows) || lock().off {
            return forward(rows);
        }
        let n = rows.len();
        let spans = Spans::of(rows);
        let ids: Vec<i32> = Spans::stack(rows).into_iter().map(|t| t as i32).collect();
        let mut caches: Vec<_> = rows.iter_mut().map(|r| (&mut *r.cache, 1)).collect();
        let plan = self.plan_host(&mut caches, None, &[])?;
        drop(caches);
        let key = (n, plan.long());
        let slot = lock().slots.remove(&key);
        let slot = match slot {
            Some(mut slot) => {
                self.refill_plan(&mut slot.step.kv, &plan)?;
                self.stream.memcpy_htod(&ids, &mut slot.step.ids).map_err(drv("upload tokens"))?;
                slot
            }
            None => {
                let step = Step {
                    ids: self.stream.clone_htod(&ids).map_err(drv("upload tokens"))?,
                    kv: self.upload_plan(&plan)?,
                    // SAFETY: f32 has no invalid bit patterns; the graph writes every value.
                    logits: unsafe { self.stream.alloc(n * vocab) }.map_err(drv("alloc logits"))?,
                };
                match self.capture(graphs, step, rows, &mut forward) {
                    Ok(slot) => slot,
                    Err(e) => {
                        tracing::warn!(error = %e, rows = n, "CUDA graph capture failed; decode runs eagerly");
                        lock().set(false);
                        return forward(rows);
                    }
                }
            }
        };
        slot.graph.0.launch().map_err(drv("launch graph"))?;
        let logits = self.land(rows, &spans, &slot.step.kv, Some(&slot.step.logits))?;
        lock().slots.insert(key, slot);
        Ok(split(logits, &vec![1; n], vocab))
    }

    /// Record `forward` over `rows` into a graph using `step`'s buffers.
    fn capture<F>(&self, graphs: &Mutex<Graphs>, step: Step, rows: &mut [Row<'_>], forward: &mut F) -> Result<Slot>
    where
        F: FnMut(&mut [Row<'_>]) -> Result<Vec<Vec<f32>>>,
    {
        let lock = || graphs.lock().unwrap_or_else(|e| e.into_inner());
        lock().capturing = Some(step);
        let begun = self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        let recorded = begun.map_err(drv("begin capture")).and_then(|()| forward(rows));
        // End the capture whatever happened, so the stream is usable again.
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        let step = {
            let mut g = lock();
            g.captured.take().or_else(|| g.capturing.take())
        };
        if let Err(e) = recorded {
            // Whatever the failed recording queued is dropped with it; a buffer it freed
            // inside the capture left a "not permitted while capturing" error in the
            // context, which would fail the next op. The step's own buffers are freed here,
            // after the capture, and the stale error is cleared.
            drop(step);
            if let Err(stale) = self.stream.context().check_err() {
                tracing::debug!(error = %stale, "cleared the failed capture's error");
            }
            return Err(e);
        }
        let graph = ended
            .map_err(drv("end capture"))?
            .ok_or_else(|| crate::error::Error::Cuda { op: "end capture", reason: "no graph recorded".into() })?;
        let step = step.ok_or_else(|| crate::error::Error::Cuda {
            op: "capture",
            reason: "the forward did not finish the step".into(),
        })?;
        tracing::debug!(rows = rows.len(), "decode step captured as a CUDA graph");
        Ok(Slot { step, graph: OwnedGraph(graph) })
    }
}
