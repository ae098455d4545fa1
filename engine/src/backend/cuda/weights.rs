//! Quantized weight matrices on the device, repacked at upload from GGUF blocks into a
//! struct of arrays (quant bytes / scales / mins / extra bytes, each contiguous per
//! block in row-major order) so the 32 lanes of a GEMV warp load one contiguous span.
//! The layout each kernel expects is described at the top of `kernels/gemv.cu`.

use candle_core::quantized::GgmlDType;
use cudarc::driver::CudaSlice;
use half::f16;

use super::device::{Gpu, drv};
use crate::error::{Error, Result};

/// Per-format block geometry: values per block, GGUF bytes per block, repacked quant
/// bytes per block, extra bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub values: usize,
    pub bytes: usize,
    pub qbytes: usize,
    pub aux: usize,
}

pub(crate) fn geometry(dtype: GgmlDType) -> Option<Geometry> {
    let g = |values, bytes, qbytes, aux| Some(Geometry { values, bytes, qbytes, aux });
    match dtype {
        GgmlDType::Q4_0 => g(32, 18, 16, 0),
        GgmlDType::Q4_1 => g(32, 20, 16, 0),
        GgmlDType::Q5_0 => g(32, 22, 16, 4),
        GgmlDType::Q8_0 => g(32, 34, 32, 0),
        GgmlDType::Q4K => g(256, 144, 128, 16),
        GgmlDType::Q6K => g(256, 210, 192, 16),
        _ => None,
    }
}

/// The repacked arrays on the host (pure; tested without a device).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Repacked {
    pub qs: Vec<u8>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
    pub aux: Vec<u8>,
}

fn h(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Repack the raw GGUF bytes of an `[n, k]` matrix of `dtype`.
pub(crate) fn repack(name: &str, dtype: GgmlDType, bytes: &[u8], k: usize, n: usize) -> Result<Repacked> {
    let bad = |reason: String| Error::Tensor { name: name.to_owned(), reason };
    let g = geometry(dtype).ok_or_else(|| bad(format!("no CUDA kernel for {dtype:?}")))?;
    if !k.is_multiple_of(g.values) {
        return Err(bad(format!("row length {k} is not a multiple of {}", g.values)));
    }
    let blocks = k / g.values * n;
    if bytes.len() != blocks * g.bytes {
        return Err(bad(format!("{} bytes, expected {}", bytes.len(), blocks * g.bytes)));
    }
    let mut r = Repacked {
        qs: Vec::with_capacity(blocks * g.qbytes),
        d: Vec::with_capacity(blocks),
        m: Vec::new(),
        aux: Vec::with_capacity(blocks * g.aux),
    };
    for b in bytes.chunks_exact(g.bytes) {
        match dtype {
            GgmlDType::Q4_0 | GgmlDType::Q8_0 => {
                r.d.push(h(b, 0));
                r.qs.extend_from_slice(&b[2..]);
            }
            GgmlDType::Q4_1 => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                r.qs.extend_from_slice(&b[4..]);
            }
            GgmlDType::Q5_0 => {
                r.d.push(h(b, 0));
                r.aux.extend_from_slice(&b[2..6]);
                r.qs.extend_from_slice(&b[6..]);
            }
            GgmlDType::Q4K => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                let s = &b[4..16];
                let mut sm = [0u8; 16];
                for j in 0..8 {
                    // ggml's get_scale_min_k4: 6-bit scales and mins packed in 12 bytes.
                    (sm[j], sm[8 + j]) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
                    };
                }
                r.aux.extend_from_slice(&sm);
                r.qs.extend_from_slice(&b[16..]);
            }
            GgmlDType::Q6K => {
                r.qs.extend_from_slice(&b[..192]);
                r.aux.extend_from_slice(&b[192..208]);
                r.d.push(h(b, 208));
            }
            _ => unreachable!("geometry() accepted only the formats above"),
        }
    }
    Ok(r)
}

/// The raw GGUF bytes of a weight matrix `[n, k]`, as `Linear::load` reads them.
#[derive(Clone, Copy)]
pub struct MatrixBytes<'a> {
    pub name: &'a str,
    pub dtype: GgmlDType,
    pub bytes: &'a [u8],
    /// Row length (input features).
    pub k: usize,
    /// Rows (output features).
    pub n: usize,
}

/// A weight matrix `[n, k]` resident on the device.
pub struct DeviceWeights {
    pub(crate) dtype: GgmlDType,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) qs: CudaSlice<u8>,
    pub(crate) d: CudaSlice<f32>,
    pub(crate) m: CudaSlice<f32>,
    pub(crate) aux: CudaSlice<u8>,
}

impl DeviceWeights {
    /// Repack the matrix's GGUF bytes and copy them to `gpu`.
    pub fn upload(gpu: &Gpu, w: MatrixBytes<'_>) -> Result<Self> {
        let MatrixBytes { name, dtype, bytes, k, n } = w;
        let r = repack(name, dtype, bytes, k, n)?;
        // Kernels never read the arrays a format does not have; keep them non-empty so
        // every pointer argument is a real allocation.
        let pad = |v: Vec<u8>| if v.is_empty() { vec![0u8; 1] } else { v };
        let padf = |v: Vec<f32>| if v.is_empty() { vec![0f32; 1] } else { v };
        let s = &gpu.stream;
        let up = drv("upload weights");
        Ok(Self {
            dtype,
            n,
            k,
            qs: s.clone_htod(&r.qs).map_err(up)?,
            d: s.clone_htod(&r.d).map_err(drv("upload weights"))?,
            m: s.clone_htod(&padf(r.m)).map_err(drv("upload weights"))?,
            aux: s.clone_htod(&pad(r.aux)).map_err(drv("upload weights"))?,
        })
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// Bytes held on the device.
    pub fn device_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len()) + self.aux.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repack_splits_q4_k_scales_like_ggml() {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.25).to_le_bytes());
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend([3, 5, 7, 9, 2, 4, 6, 8, 0x11, 0x22, 0x33, 0x44]);
        b.extend((0..128).map(|i| i as u8));
        let r = repack("w", GgmlDType::Q4K, &b, 256, 1).expect("valid block");
        assert_eq!(&r.aux[..8], &[3, 5, 7, 9, 1, 2, 3, 4]);
        assert_eq!(&r.aux[8..], &[2, 4, 6, 8, 1, 2, 3, 4]);
        assert_eq!((r.d[0], r.m[0], r.qs.len(), r.qs[5]), (0.25, 0.5, 128, 5));
        assert!(repack("w", GgmlDType::Q4K, &b[1..], 256, 1).is_err());
        assert!(repack("w", GgmlDType::F32, &b, 256, 1).is_err());
    }
}
