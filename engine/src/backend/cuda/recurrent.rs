//! A hybrid sequence's recurrent state (`crate::recurrent`) on the device, kept with its
//! KV mirror (`kv::DeviceKv::rec`) while the sequence runs: one buffer laid out as the
//! host's `RecurrentState` (every layer's convolution state, then every layer's
//! delta-rule state), which the `hybrid.cu` kernels update in place.
//!
//! While the sequence runs the device copy is the truth: a pass leaves it there
//! (`land_recurrent`: `SeqCache::leave_state_on_device`), and the host copy is fetched
//! only when the host reads it (a checkpoint, the prompt cache's store: `SeqCache::settle`
//! through `MirrorData::fetch_state`) — a 9B model's state is ~50 MB, more than a decode
//! step's time over the bus. A state is uploaded only when the device copy is not the
//! host state's exact values and not newer: the host state's `stamp` changes with every
//! write, clone or restore, and the device copy remembers the stamp it was synced with
//! (none after a pass wrote it).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::device::{Gpu, drv};
use super::kv::DeviceKv;
use crate::backend::batch::Row;
use crate::error::{Error, Result};
use crate::kv::{MirrorData, SeqCache};
use crate::recurrent::RecurrentState;

pub(crate) struct DeviceState {
    buf: CudaSlice<f32>,
    /// The host state's stamp these values are (0: none — a pass is writing them, or
    /// wrote them and the host copy is stale).
    stamp: u64,
    /// The stream that writes `buf` (a fetch reads it there).
    stream: Arc<CudaStream>,
}

impl MirrorData for DeviceKv {
    fn fetch_state(&mut self, host: &mut RecurrentState) -> Result<()> {
        let rec =
            self.rec.as_mut().ok_or_else(|| Error::Cuda { op: "fetch state", reason: "no device state".into() })?;
        let (conv, ssm) = host.parts_mut();
        let n_conv = conv.len();
        if rec.buf.len() != n_conv + ssm.len() {
            return Err(Error::Cuda { op: "fetch state", reason: "device state of another shape".into() });
        }
        let down = || drv("download recurrent state");
        rec.stream.memcpy_dtoh(&rec.buf.slice(..n_conv), conv).map_err(down())?;
        rec.stream.memcpy_dtoh(&rec.buf.slice(n_conv..), ssm).map_err(down())?;
        rec.stream.synchronize().map_err(down())?;
        rec.stamp = host.stamp();
        tracing::debug!(bytes = rec.buf.len() * 4, "recurrent state fetched from the device");
        Ok(())
    }
}

impl Gpu {
    /// Make `cache`'s device state hold its recurrent state (after its KV mirror was
    /// synced); its address for the pass, 0 for a sequence without one.
    pub(crate) fn sync_recurrent(&self, cache: &mut SeqCache) -> Result<u64> {
        let Some(host) = cache.recurrent() else { return Ok(0) };
        let (stamp, n_conv) = (host.stamp(), host.conv().len());
        let n = n_conv + host.ssm().len();
        let on_device = cache.state_on_device();
        let mut mirror = cache.mirror_mut().take();
        let synced = (|| {
            let kv = mirror.as_mut().and_then(|m| m.data.downcast_mut::<DeviceKv>());
            let kv = kv.ok_or_else(|| Error::Cuda { op: "sync recurrent state", reason: "no KV mirror".into() })?;
            if kv.rec.as_ref().is_none_or(|r| r.buf.len() != n) {
                // SAFETY: f32 has no invalid bit patterns; the upload below fills it all
                // (its stamp 0 never matches a host state's).
                let buf = unsafe { self.stream.alloc(n) }.map_err(drv("alloc recurrent state"))?;
                if on_device {
                    return Err(Error::Cuda { op: "sync recurrent state", reason: "the live state was lost".into() });
                }
                kv.rec = Some(DeviceState { buf, stamp: 0, stream: self.stream.clone() });
            }
            let rec = kv.rec.as_mut().unwrap_or_else(|| unreachable!("made above"));
            let host = cache.recurrent().unwrap_or_else(|| unreachable!("checked above"));
            if !on_device && rec.stamp != stamp {
                let up = || drv("upload recurrent state");
                self.stream.memcpy_htod(host.conv(), &mut rec.buf.slice_mut(..n_conv)).map_err(up())?;
                self.stream.memcpy_htod(host.ssm(), &mut rec.buf.slice_mut(n_conv..)).map_err(up())?;
                tracing::debug!(bytes = n * 4, "recurrent state uploaded to the device");
            }
            // The pass writes it: not the host's values until it lands.
            rec.stamp = 0;
            let (ptr, _) = rec.buf.device_ptr(&self.stream);
            Ok(ptr)
        })();
        *cache.mirror_mut() = mirror;
        synced
    }

    /// After a pass: each row's state stays on the device, newer than the host's.
    pub(crate) fn land_recurrent(&self, rows: &mut [Row<'_>]) -> Result<()> {
        for r in rows.iter_mut().filter(|r| r.cache.recurrent().is_some()) {
            let rec = r
                .cache
                .mirror_mut()
                .as_mut()
                .and_then(|m| m.data.downcast_mut::<DeviceKv>())
                .and_then(|k| k.rec.as_mut());
            let Some(rec) = rec else {
                return Err(Error::Cuda { op: "land recurrent state", reason: "no device state".into() });
            };
            rec.stamp = 0;
            r.cache.leave_state_on_device();
        }
        Ok(())
    }
}
