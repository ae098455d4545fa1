//! A hybrid sequence's recurrent state (`crate::recurrent`) on the device, kept with its
//! KV mirror (`kv::DeviceKv::rec`) while the sequence runs: one buffer laid out as the
//! host's `RecurrentState` (every layer's convolution state, then every layer's
//! delta-rule state), which the `hybrid.cu` kernels update in place.
//!
//! The host copy stays the truth the prompt cache and checkpoints snapshot: every pass
//! downloads its rows' states when it lands (`land_recurrent`), and a state is uploaded
//! only when the device copy is not of the host state's exact values — the host state's
//! `stamp` changes with every write, clone or restore, and the device copy remembers the
//! stamp it was synced with (none while a pass that may fail is writing it).

use cudarc::driver::{CudaSlice, DevicePtr};

use super::device::{Gpu, drv};
use super::kv::DeviceKv;
use crate::backend::batch::Row;
use crate::error::{Error, Result};
use crate::kv::SeqCache;

pub(crate) struct DeviceState {
    buf: CudaSlice<f32>,
    /// The host state's stamp these values are (0: none, a pass may be writing them).
    stamp: u64,
}

impl Gpu {
    /// Make `cache`'s device state hold its recurrent state (after its KV mirror was
    /// synced); its address for the pass, 0 for a sequence without one.
    pub(crate) fn sync_recurrent(&self, cache: &mut SeqCache) -> Result<u64> {
        let Some(host) = cache.recurrent() else { return Ok(0) };
        let (stamp, n_conv) = (host.stamp(), host.conv().len());
        let n = n_conv + host.ssm().len();
        let mut mirror = cache.mirror_mut().take();
        let synced = (|| {
            let kv = mirror.as_mut().and_then(|m| m.data.downcast_mut::<DeviceKv>());
            let kv = kv.ok_or_else(|| Error::Cuda { op: "sync recurrent state", reason: "no KV mirror".into() })?;
            if kv.rec.as_ref().is_none_or(|r| r.buf.len() != n) {
                // SAFETY: f32 has no invalid bit patterns; the upload below fills it all
                // (its stamp 0 never matches a host state's).
                let buf = unsafe { self.stream.alloc(n) }.map_err(drv("alloc recurrent state"))?;
                kv.rec = Some(DeviceState { buf, stamp: 0 });
            }
            let rec = kv.rec.as_mut().unwrap_or_else(|| unreachable!("made above"));
            let host = cache.recurrent().unwrap_or_else(|| unreachable!("checked above"));
            if rec.stamp != stamp {
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

    /// After a pass (the stream synchronized): each row's device state into its host
    /// state, which the device copy then matches.
    pub(crate) fn land_recurrent(&self, rows: &mut [Row<'_>]) -> Result<()> {
        for r in rows.iter_mut() {
            if r.cache.recurrent().is_none() {
                continue;
            }
            let mut mirror = r.cache.mirror_mut().take();
            let rec = mirror.as_mut().and_then(|m| m.data.downcast_mut::<DeviceKv>()).and_then(|k| k.rec.as_mut());
            let landed = match (rec, r.cache.recurrent_write()) {
                (Some(rec), Some(host)) => {
                    let (conv, ssm) = host.parts_mut();
                    let n_conv = conv.len();
                    let down = || drv("download recurrent state");
                    let copied = self
                        .stream
                        .memcpy_dtoh(&rec.buf.slice(..n_conv), conv)
                        .and_then(|()| self.stream.memcpy_dtoh(&rec.buf.slice(n_conv..), ssm))
                        .map_err(down());
                    copied.map(|()| rec.stamp = host.stamp())
                }
                _ => Ok(()),
            };
            *r.cache.mirror_mut() = mirror;
            landed?;
        }
        self.synchronize()
    }
}
