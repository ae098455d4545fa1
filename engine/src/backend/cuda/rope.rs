//! Scaled rotary tables on the device: each distinct table's per-pair terms
//! (`RopeAngles::terms`: Llama 3's frequency factors, phi3's LongRoPE, linear and YaRN
//! scaling) uploaded once and kept for the backend's lifetime, so that a captured decode
//! graph may hold their address.

use std::sync::Mutex;

use cudarc::driver::{CudaSlice, DevicePtr};

use super::device::{Gpu, drv};
use super::ops::ScaledRope;
use crate::error::{Error, Result};
use crate::kernels::rope::{RopeAngles, RopeTerms};

#[derive(Default)]
pub(super) struct RopeTables {
    tables: Mutex<Vec<(RopeTerms, CudaSlice<f32>)>>,
}

impl RopeTables {
    /// The device form of `a`'s table; `None` for a plain one. A table not uploaded yet
    /// is uploaded here, which a stream being captured cannot do (`capturing`): models
    /// upload theirs at load (`Backend::prepare_rope`), as a first pass may be a single
    /// token, captured as a decode step.
    pub(super) fn get(&self, gpu: &Gpu, a: &RopeAngles<'_>, capturing: bool) -> Result<Option<ScaledRope>> {
        let Some(terms) = a.terms() else { return Ok(None) };
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let at = match tables.iter().position(|(t, _)| *t == terms) {
            Some(i) => i,
            None if capturing => {
                let reason = "a rotary table first seen in a captured decode step".into();
                return Err(Error::Cuda { op: "capture", reason });
            }
            None => {
                let pairs = gpu.stream.clone_htod(&terms.pairs).map_err(drv("upload rotary table"))?;
                tables.push((terms, pairs));
                tables.len() - 1
            }
        };
        let (terms, pairs) = &tables[at];
        let (ptr, _sync) = pairs.device_ptr(&gpu.stream);
        Ok(Some(ScaledRope { pairs: ptr, freq_scale: terms.freq_scale, mscale: terms.mscale }))
    }
}
