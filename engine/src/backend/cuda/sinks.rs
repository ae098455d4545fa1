//! Attention sinks on the device (gpt-oss's `attn_sinks`: one logit a query head): each
//! distinct set uploaded once and kept for the backend's lifetime, found again by its
//! values, so a captured decode graph may hold its address. Models upload theirs at load
//! (`Backend::prepare_sinks`): a stream being captured cannot upload.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaSlice, DevicePtr};

use super::device::{Gpu, drv};
use crate::error::{Error, Result};

#[derive(Default)]
pub(super) struct SinkTables {
    /// By the values' bits.
    tables: Mutex<HashMap<Vec<u32>, CudaSlice<f32>>>,
}

impl SinkTables {
    /// The device address of `sinks`' copy, uploaded here if there is none yet (refused
    /// while the stream is being captured).
    pub(super) fn get(&self, gpu: &Gpu, sinks: &[f32]) -> Result<u64> {
        let key: Vec<u32> = sinks.iter().map(|s| s.to_bits()).collect();
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if !tables.contains_key(&key) {
            let status = gpu.stream.capture_status().map_err(drv("capture status"))?;
            if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                let reason = "attention sinks first seen in a captured decode step".into();
                return Err(Error::Cuda { op: "capture", reason });
            }
            let copy = gpu.stream.clone_htod(sinks).map_err(drv("upload attention sinks"))?;
            tables.insert(key.clone(), copy);
        }
        let (ptr, _sync) = tables[&key].device_ptr(&gpu.stream);
        Ok(ptr)
    }
}
