//! Quantized weight matrices on the device, repacked at upload from GGUF blocks into a
//! struct of arrays (quant bytes / scales / mins / extra bytes, each contiguous per
//! block in row-major order) so the 32 lanes of a GEMV warp load one contiguous span.
//! The layout each kernel expects is described at the top of `kernels/gemv.cu`.

use candle_core::quantized::GgmlDType;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::f16;

use super::device::{Gpu, drv};
use crate::error::{Error, Result};
use crate::gguf::Stored;
use crate::kernels::quant::e8m0_half;

/// Per-format block geometry: values per block, GGUF bytes per block, repacked quant
/// bytes per block, extra bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub values: usize,
    pub bytes: usize,
    pub qbytes: usize,
    pub aux: usize,
}

pub(crate) fn geometry(dtype: Stored) -> Option<Geometry> {
    use GgmlDType::*;
    let g = |values, bytes, qbytes, aux| Some(Geometry { values, bytes, qbytes, aux });
    match dtype {
        Stored::Ggml(Q4_0) => g(32, 18, 16, 0),
        Stored::Ggml(Q4_1) => g(32, 20, 16, 0),
        Stored::Ggml(Q5_0) => g(32, 22, 16, 4),
        Stored::Ggml(Q5_1) => g(32, 24, 16, 4),
        Stored::Ggml(Q8_0) => g(32, 34, 32, 0),
        Stored::Iq4Nl => g(32, 18, 16, 0),
        // An E8M0 exponent byte, then IQ4_NL's 16 bytes of nibbles.
        Stored::Mxfp4 => g(32, 17, 16, 0),
        Stored::Ggml(Q2K) => g(256, 84, 64, 16),
        Stored::Ggml(Q3K) => g(256, 110, 96, 16),
        Stored::Ggml(Q4K) => g(256, 144, 128, 16),
        Stored::Ggml(Q5K) => g(256, 176, 128, 48),
        Stored::Ggml(Q6K) => g(256, 210, 192, 16),
        Stored::Iq4Xs => g(256, 136, 128, 8),
        // Unquantized: blocks of 32 values only so that a GEMV lane's items tile rows.
        Stored::Ggml(F16 | BF16) => g(32, 64, 64, 0),
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

/// ggml's `get_scale_min_k4` for all eight sub-blocks: the 6-bit scales and mins
/// packed in 12 bytes (Q4_K, Q5_K), unpacked as 8 scales then 8 mins.
fn scale_min_k4(s: &[u8]) -> [u8; 16] {
    let mut sm = [0u8; 16];
    for j in 0..8 {
        (sm[j], sm[8 + j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        };
    }
    sm
}

/// Q3_K's sixteen 6-bit scales (low 4 bits in the nibbles of bytes 0..8, high 2 bits
/// in bytes 8..12), 32 taken off: signed bytes.
fn q3_k_scales(sc: &[u8]) -> [u8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { sc[i] & 0xf } else { sc[i - 8] >> 4 };
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        ((low | (high << 4)) as i8 - 32) as u8
    })
}

/// IQ4_XS's eight 6-bit scales (low nibbles in 4 bytes, high 2 bits in a u16), 32
/// taken off: signed bytes.
fn iq4_xs_scales(b: &[u8]) -> [u8; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0xf;
        let hi = ((high >> (2 * s)) & 3) as u8;
        ((lo | (hi << 4)) as i8 - 32) as u8
    })
}

/// Repack the raw GGUF bytes of an `[n, k]` matrix of `dtype`.
pub(crate) fn repack(name: &str, dtype: Stored, bytes: &[u8], k: usize, n: usize) -> Result<Repacked> {
    use GgmlDType::*;
    let bad = |reason: String| Error::Tensor { name: name.to_owned(), reason };
    let g = geometry(dtype).ok_or_else(|| bad(format!("no CUDA kernel for {dtype:?}")))?;
    if !k.is_multiple_of(g.values) {
        return Err(bad(format!("row length {k} is not a multiple of {}", g.values)));
    }
    let blocks = k / g.values * n;
    if bytes.len() != blocks * g.bytes {
        return Err(bad(format!("{} bytes, expected {}", bytes.len(), blocks * g.bytes)));
    }
    if matches!(dtype, Stored::Ggml(F16 | BF16)) {
        // The values as they are: no scales.
        return Ok(Repacked { qs: bytes.to_vec(), ..Repacked::default() });
    }
    let mut r = Repacked {
        qs: Vec::with_capacity(blocks * g.qbytes),
        d: Vec::with_capacity(blocks),
        m: Vec::new(),
        aux: Vec::with_capacity(blocks * g.aux),
    };
    for b in bytes.chunks_exact(g.bytes) {
        match dtype {
            Stored::Ggml(Q4_0 | Q8_0) | Stored::Iq4Nl => {
                r.d.push(h(b, 0));
                r.qs.extend_from_slice(&b[2..]);
            }
            Stored::Mxfp4 => {
                // The scale as the CPU reads it (`e8m0_half`, exact in f32), over the
                // table's doubled values: IQ4_NL's layout with MXFP4's table.
                r.d.push(e8m0_half(b[0]));
                r.qs.extend_from_slice(&b[1..]);
            }
            Stored::Ggml(Q4_1) => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                r.qs.extend_from_slice(&b[4..]);
            }
            Stored::Ggml(Q5_0) => {
                r.d.push(h(b, 0));
                r.aux.extend_from_slice(&b[2..6]);
                r.qs.extend_from_slice(&b[6..]);
            }
            Stored::Ggml(Q5_1) => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                r.aux.extend_from_slice(&b[4..8]);
                r.qs.extend_from_slice(&b[8..]);
            }
            Stored::Ggml(Q2K) => {
                // Scales (low nibble) and mins (high nibble) stay packed: one byte each.
                r.aux.extend_from_slice(&b[..16]);
                r.qs.extend_from_slice(&b[16..80]);
                r.d.push(h(b, 80));
                r.m.push(h(b, 82));
            }
            Stored::Ggml(Q3K) => {
                // hmask then the low bits, as in the block.
                r.qs.extend_from_slice(&b[..96]);
                r.aux.extend_from_slice(&q3_k_scales(&b[96..108]));
                r.d.push(h(b, 108));
            }
            Stored::Ggml(Q4K) => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                r.aux.extend_from_slice(&scale_min_k4(&b[4..16]));
                r.qs.extend_from_slice(&b[16..]);
            }
            Stored::Ggml(Q5K) => {
                r.d.push(h(b, 0));
                r.m.push(h(b, 2));
                r.aux.extend_from_slice(&scale_min_k4(&b[4..16]));
                r.aux.extend_from_slice(&b[16..48]);
                r.qs.extend_from_slice(&b[48..]);
            }
            Stored::Ggml(Q6K) => {
                r.qs.extend_from_slice(&b[..192]);
                r.aux.extend_from_slice(&b[192..208]);
                r.d.push(h(b, 208));
            }
            Stored::Iq4Xs => {
                r.d.push(h(b, 0));
                r.aux.extend_from_slice(&iq4_xs_scales(b));
                r.qs.extend_from_slice(&b[8..]);
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
    pub dtype: Stored,
    pub bytes: &'a [u8],
    /// Row length (input features).
    pub k: usize,
    /// Rows (output features).
    pub n: usize,
}

/// A weight matrix `[n, k]` resident on the device.
pub struct DeviceWeights {
    pub(crate) dtype: Stored,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) qs: CudaSlice<u8>,
    pub(crate) d: CudaSlice<f32>,
    pub(crate) m: CudaSlice<f32>,
    pub(crate) aux: CudaSlice<u8>,
    /// Added to every product (`attach_bias`): the GEMV adds it as it writes, the long
    /// chunks' GEMMs in one pass after.
    pub(crate) bias: Option<CudaSlice<f32>>,
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
            d: s.clone_htod(&padf(r.d)).map_err(drv("upload weights"))?,
            m: s.clone_htod(&padf(r.m)).map_err(drv("upload weights"))?,
            aux: s.clone_htod(&pad(r.aux)).map_err(drv("upload weights"))?,
            bias: None,
        })
    }

    /// The bias's device address, 0 (null) without one.
    pub(crate) fn bias_ptr(&self, s: &CudaStream) -> u64 {
        self.bias.as_ref().map_or(0, |b| b.device_ptr(s).0)
    }

    pub fn dtype(&self) -> Stored {
        self.dtype
    }

    /// Bytes held on the device.
    pub fn device_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len() + self.bias.as_ref().map_or(0, |b| b.len())) + self.aux.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    fn ggml(t: GgmlDType) -> Stored {
        Stored::Ggml(t)
    }

    #[test]
    fn repack_splits_q4_k_scales_like_ggml() {
        let mut b = Vec::new();
        b.extend(f16b(0.25));
        b.extend(f16b(0.5));
        b.extend([3, 5, 7, 9, 2, 4, 6, 8, 0x11, 0x22, 0x33, 0x44]);
        b.extend((0..128).map(|i| i as u8));
        let r = repack("w", ggml(GgmlDType::Q4K), &b, 256, 1).expect("valid block");
        assert_eq!(&r.aux[..8], &[3, 5, 7, 9, 1, 2, 3, 4]);
        assert_eq!(&r.aux[8..], &[2, 4, 6, 8, 1, 2, 3, 4]);
        assert_eq!((r.d[0], r.m[0], r.qs.len(), r.qs[5]), (0.25, 0.5, 128, 5));
        assert!(repack("w", ggml(GgmlDType::Q4K), &b[1..], 256, 1).is_err());
        assert!(repack("w", ggml(GgmlDType::F32), &b, 256, 1).is_err());
    }

    #[test]
    fn repack_q5_1_and_iq4_nl_split_scale_min_high_bits() {
        let mut b = Vec::new();
        b.extend(f16b(0.125));
        b.extend(f16b(-2.0));
        b.extend([0xde, 0xad, 0xbe, 0xef]);
        b.extend((0..16).map(|i| 100 + i as u8));
        let r = repack("w", ggml(GgmlDType::Q5_1), &b, 32, 1).expect("q5_1");
        assert_eq!((r.d[0], r.m[0], &r.aux[..]), (0.125, -2.0, &[0xde, 0xad, 0xbe, 0xef][..]));
        assert_eq!((r.qs.len(), r.qs[0], r.qs[15]), (16, 100, 115));
        let nl: Vec<u8> = f16b(3.0).into_iter().chain((0..16).map(|i| i as u8 * 17)).collect();
        let r = repack("w", Stored::Iq4Nl, &nl, 32, 1).expect("iq4_nl");
        assert_eq!((r.d[..].to_vec(), r.m.len(), r.aux.len(), r.qs[3]), (vec![3.0], 0, 0, 51));
        assert!(repack("w", Stored::Iq4Nl, &nl, 64, 1).is_err(), "two blocks' bytes expected");
    }

    #[test]
    fn repack_mxfp4_takes_the_e8m0_half_scale_and_keeps_the_nibbles() {
        let mut b = vec![121u8];
        b.extend((0..16).map(|i| i as u8 * 17));
        b.push(1);
        b.extend([0xab; 16]);
        let r = repack("w", Stored::Mxfp4, &b, 32, 2).expect("mxfp4");
        // 2^(121 - 127) / 2, and a subnormal 2^-127 for exponent 1 (as `e8m0_half`).
        assert_eq!(r.d, vec![2f32.powi(-7), 2f32.powi(-127)]);
        assert_eq!((r.qs.len(), r.qs[3], r.qs[16], r.m.len(), r.aux.len()), (32, 51, 0xab, 0, 0));
        assert!(repack("w", Stored::Mxfp4, &b[..17], 32, 2).is_err(), "two blocks' bytes expected");
    }

    #[test]
    fn repack_q2_k_keeps_packed_scales_and_reads_trailing_scales() {
        let mut b: Vec<u8> = (0..16).map(|i| (i as u8) << 4 | (15 - i as u8)).collect();
        b.extend((0..64).map(|i| 200 - i as u8));
        b.extend(f16b(0.75));
        b.extend(f16b(0.0625));
        let r = repack("w", ggml(GgmlDType::Q2K), &b, 256, 1).expect("q2_k");
        assert_eq!((r.aux.len(), r.aux[1], r.qs.len(), r.qs[63]), (16, 0x1e, 64, 137));
        assert_eq!((r.d[0], r.m[0]), (0.75, 0.0625));
    }

    #[test]
    fn repack_q3_k_unpacks_signed_scales_like_ggml() {
        let mut b: Vec<u8> = (0..96).map(|i| i as u8).collect();
        // Scale i: low nibble from byte i (i < 8) or the high nibble of byte i - 8, high
        // two bits from byte 8 + i % 4 at bits 2 (i / 4).
        b.extend([0x21, 0x43, 0x65, 0x87, 0xa9, 0xcb, 0xed, 0x0f, 0b11_10_01_00, 0, 0xff, 0]);
        b.extend(f16b(1.5));
        let r = repack("w", ggml(GgmlDType::Q3K), &b, 256, 1).expect("q3_k");
        let sc: Vec<i8> = r.aux.iter().map(|&v| v as i8).collect();
        // i = 0: low 1, high bits 00 -> 1 - 32; i = 4: low 9, high 01 -> 25 - 32;
        // i = 8: low 2 (0x21 >> 4), high 10 -> 34 - 32; i = 12: low 0xa, high 11 -> 58 - 32;
        // i = 2: low 5, high from byte 10 bits 0..2 = 3 -> 53 - 32.
        assert_eq!((sc[0], sc[4], sc[8], sc[12], sc[2]), (-31, -7, 2, 26, 21));
        assert_eq!((r.qs.len(), r.qs[40], r.d[0]), (96, 40, 1.5));
    }

    #[test]
    fn repack_q5_k_puts_high_bits_after_unpacked_scales() {
        let mut b = Vec::new();
        b.extend(f16b(0.25));
        b.extend(f16b(0.5));
        b.extend([3, 5, 7, 9, 2, 4, 6, 8, 0x11, 0x22, 0x33, 0x44]);
        b.extend((0..32).map(|i| 0x80 | i as u8));
        b.extend((0..128).map(|i| i as u8));
        let r = repack("w", ggml(GgmlDType::Q5K), &b, 256, 1).expect("q5_k");
        assert_eq!(&r.aux[..16], &[3, 5, 7, 9, 1, 2, 3, 4, 2, 4, 6, 8, 1, 2, 3, 4]);
        assert_eq!((r.aux.len(), r.aux[16], r.aux[47]), (48, 0x80, 0x9f));
        assert_eq!((r.d[0], r.m[0], r.qs.len(), r.qs[127]), (0.25, 0.5, 128, 127));
    }

    #[test]
    fn repack_iq4_xs_unpacks_signed_scales_like_ggml() {
        let mut b = Vec::new();
        b.extend(f16b(2.0));
        // scales_h: sub-block s's high bits at 2s: s0 = 0, s1 = 1, s2 = 2, s3 = 3, rest 0.
        b.extend(0b11_10_01_00u16.to_le_bytes());
        b.extend([0x21, 0x43, 0x65, 0x87]);
        b.extend((0..128).map(|i| i as u8));
        let r = repack("w", Stored::Iq4Xs, &b, 256, 1).expect("iq4_xs");
        let sc: Vec<i8> = r.aux.iter().map(|&v| v as i8).collect();
        assert_eq!(sc, [1 - 32, 2 + 16 - 32, 3 + 32 - 32, 4 + 48 - 32, 5 - 32, 6 - 32, 7 - 32, 8 - 32]);
        assert_eq!((r.d[0], r.qs.len(), r.qs[9]), (2.0, 128, 9));
    }

    #[test]
    fn repack_f16_and_bf16_keep_the_values() {
        let b: Vec<u8> = (0..128).map(|i| i as u8).collect();
        for t in [GgmlDType::F16, GgmlDType::BF16] {
            let r = repack("w", ggml(t), &b, 32, 2).expect("float");
            assert_eq!((r.qs, r.d.len(), r.aux.len()), (b.clone(), 0, 0));
            assert!(repack("w", ggml(t), &b, 64, 2).is_err(), "{t:?}: 128 bytes are 64 values");
            assert!(repack("w", ggml(t), &b[..80], 40, 1).is_err(), "{t:?}: rows of whole 32s only");
        }
    }
}
