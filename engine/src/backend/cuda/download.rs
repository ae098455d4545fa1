//! The end of a pass on the host side: the requested logits and the pass's new K/V come
//! back through page-locked buffers kept for reuse (a copy from pageable memory runs at
//! a fraction of the bus speed and stalls on staging), the K/V go into the host cache
//! blocks (the truth the prompt cache and SSD tier keep), and the rows' new positions
//! are committed.

use cudarc::driver::{CudaContext, CudaSlice, DeviceRepr, PinnedHostSlice};
use half::f16;

use super::device::{Gpu, drv};
use super::kv::KvPlan;
use crate::backend::batch::{Row, Spans};
use crate::error::{Error, Result};

/// Page-locked buffers for the copies back, grown to the largest pass seen.
#[derive(Default)]
pub(crate) struct Pinned {
    logits: Option<PinnedHostSlice<f32>>,
    kv: Option<PinnedHostSlice<f16>>,
}

// SAFETY: the buffers are plain host memory owned here; they are only reached through
// the `Mutex<Pinned>` of one `Gpu`.
unsafe impl Send for Pinned {}

/// `slot`, grown to hold at least `n` values.
fn room<'a, T: DeviceRepr>(
    ctx: &std::sync::Arc<CudaContext>,
    slot: &'a mut Option<PinnedHostSlice<T>>,
    n: usize,
) -> Result<&'a mut PinnedHostSlice<T>> {
    if slot.as_ref().is_none_or(|p| p.len() < n) {
        *slot = None;
        // SAFETY: f32 and f16 have no invalid bit patterns; flags 0 is cached memory
        // (write-combined memory reads back slowly on the host).
        *slot = Some(
            unsafe { ctx.alloc_pinned_with_flags::<T>(n.next_power_of_two().max(4096), 0) }
                .map_err(drv("alloc pinned"))?,
        );
    }
    slot.as_mut().ok_or_else(|| Error::Cuda { op: "alloc pinned", reason: "no buffer".into() })
}

/// Threads for copying `bytes` of K/V into the host cache: one up to 4 MiB (a decode
/// step's few KB), else up to 8 (the first touch of freshly reserved blocks is the cost).
fn copy_threads(bytes: usize) -> usize {
    if bytes <= 4 << 20 {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

impl Gpu {
    /// After a pass has been queued: download the logits (when given) and the new K/V,
    /// write the K/V into the host caches, and commit every row's new positions.
    pub(crate) fn land(
        &self,
        rows: &mut [Row<'_>],
        spans: &Spans,
        kv: &KvPlan,
        logits: Option<&CudaSlice<f32>>,
    ) -> Result<Vec<f32>> {
        let queued = std::time::Instant::now();
        let mut pin = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let Pinned { logits: pl, kv: pk } = &mut *pin;
        let nl = logits.map_or(0, |y| y.len());
        // Into the first n values of each buffer (a copy fills its whole host slice).
        if let Some(y) = logits {
            let buf = room(&self.ctx, pl, nl)?.as_mut_slice().map_err(drv("pinned"))?;
            self.stream.memcpy_dtoh(y, &mut buf[..nl]).map_err(drv("download logits"))?;
        }
        let ns = kv.stage.len();
        let buf = room(&self.ctx, pk, ns)?;
        self.stream
            .memcpy_dtoh(&kv.stage, &mut buf.as_mut_slice().map_err(drv("pinned"))?[..ns])
            .map_err(drv("download KV"))?;
        self.synchronize()?;
        let landed = std::time::Instant::now();
        let out = match pl {
            Some(p) if nl > 0 => p.as_slice().map_err(drv("read logits"))?[..nl].to_vec(),
            _ => Vec::new(),
        };
        let stage = &buf.as_slice().map_err(drv("read KV"))?[..ns];
        let (total, d) = (kv.total, kv.kv_dim);
        for (r, &(at, n, pos0)) in rows.iter_mut().zip(spans.each()) {
            let plane = |layer: usize, which: usize| &stage[((layer * 2 + which) * total + at) * d..][..n * d];
            r.cache.write_f16_layers(pos0, n, plane, copy_threads(n * d * 2 * r.cache.shape().n_layers * 2));
        }
        tracing::debug!(
            wait_us = (landed - queued).as_micros() as u64,
            host_write_us = landed.elapsed().as_micros() as u64,
            kv_bytes = ns * 2,
            "pass landed"
        );
        spans.commit(rows);
        for r in rows.iter_mut() {
            let len = r.cache.len();
            if let Some(m) = r.cache.mirror_mut() {
                m.len = len;
            }
        }
        self.land_recurrent(rows)?;
        Ok(out)
    }
}
