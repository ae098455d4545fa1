//! Q4_K and Q6_K weights (256-value super-blocks) and their dot products with Q8_K
//! activations, in the arithmetic llama.cpp uses on x86:
//! - Q4_K goes through ggml's repacked 8x8 kernels: exact integer sums for the scales and
//!   for the mins, each folded into its own f32 accumulator by FMA, `acc - acc_min` at the
//!   end. The single-row kernel (gemv) folds once per super-block, the four-row kernel
//!   (gemm) once per pair of sub-blocks;
//! - Q6_K, for fewer than 8 rows, through `ggml_vec_dot_q6_K_q8_K` (AVX2): eight integer
//!   lanes per super-block (lane `l` takes bytes `4l..4l+4` of every 32-byte group, minus
//!   its share of the `32 * scale * bsum` offset), each FMA'd into a lane accumulator,
//!   summed as ggml's `hsum_float_8`; for 8 rows or more through ggml's tiled K-quant
//!   matmul: one exact integer per super-block, `acc = fma(s * d_w, d_a, acc)`.
//!
//! The quant bits stay packed in memory as GGUF stores them (Q4_K 152 bytes a block, Q6_K
//! 212, against GGUF's 144 / 210; one byte a value would be 280 / 276): decode streams
//! every weight once per token, so its speed is the bytes read, and a model's resident
//! size is about its file's. The kernels unpack 32 values at a time in registers, as
//! ggml's AVX2 kernels do; only the scales, minimums and `d` are decoded at load.

use half::f16;

use super::act::{ActQ8K, QK_K};
use super::dot::{fma_lanes, hsum8};
use super::simd;
use super::stream::{collect_weights, prefetch};

/// 32 values starting at `i` as a fixed-size array.
#[inline]
fn at<T, const N: usize>(v: &[T; N], i: usize) -> &[T; 32] {
    v[i..i + 32].try_into().expect("in bounds")
}

pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// ggml's `get_scale_min_k4`: eight 6-bit scales and eight 6-bit minimums packed in 12
/// bytes (Q4_K, Q5_K).
pub(super) fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut scales, mut mins) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (scales[j], mins[j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        };
    }
    (scales, mins)
}

#[derive(Clone, Copy)]
pub(crate) struct BlockQ4K {
    pub(super) d: f32,
    pub(super) dmin: f32,
    pub(super) scales: [u8; 8],
    pub(super) mins: [u8; 8],
    /// The 256 4-bit values as GGUF packs them: bytes `32j..32j + 32` hold sub-block
    /// `2j` in their low nibbles and sub-block `2j + 1` in their high nibbles.
    pub(super) qs: [u8; QK_K / 2],
}

impl BlockQ4K {
    /// Sub-block `sb`'s 32 values, one a byte (the portable kernels' view; the AVX2
    /// ones unpack in registers).
    #[inline]
    pub(super) fn sub(&self, sb: usize) -> [u8; 32] {
        simd::nibbles(at(&self.qs, sb / 2 * 32), 4 * (sb % 2) as u32)
    }
}

pub(crate) fn parse_q4_k(bytes: &[u8]) -> Vec<BlockQ4K> {
    collect_weights(bytes.chunks_exact(4 + 12 + QK_K / 2).map(|b| {
        let (scales, mins) = scale_min_k4(&b[4..16]);
        let qs = b[16..].try_into().expect("block size");
        BlockQ4K { d: f16_at(b, 0), dmin: f16_at(b, 2), scales, mins, qs }
    }))
}

/// Which of ggml's repacked Q4_K kernels a row goes through.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Q4KPath {
    Gemv,
    Gemm,
}

pub(crate) fn q4_k_q8_k(w: &[BlockQ4K], a: &[ActQ8K], path: Q4KPath) -> f32 {
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let (ds, dm) = (wb.d * ab.d, wb.dmin * ab.d);
        // Integer sums are exact in any order: scaled lanes accumulate as a vector and
        // are summed once per float step (per pair for Gemm, per block for Gemv).
        let (mut lanes, mut imin) = ([0i32; 8], 0i32);
        for pair in 0..4 {
            for sb in [2 * pair, 2 * pair + 1] {
                let p = simd::u8_i8(&wb.sub(sb), at(&ab.qs, sb * 32));
                let sc = wb.scales[sb] as i32;
                for (v, x) in lanes.iter_mut().zip(p) {
                    *v += sc * x;
                }
                imin += wb.mins[sb] as i32 * (ab.bsums[2 * sb] + ab.bsums[2 * sb + 1]);
            }
            if path == Q4KPath::Gemm || pair == 3 {
                let isum: i32 = lanes.iter().sum();
                acc = (isum as f32).mul_add(ds, acc);
                acc_min = (imin as f32).mul_add(dm, acc_min);
                (lanes, imin) = ([0; 8], 0);
            }
        }
    }
    acc - acc_min
}

#[derive(Clone, Copy)]
pub(crate) struct BlockQ6K {
    pub(super) d: f32,
    pub(super) scales: [i8; 16],
    /// The low four bits of the 256 values (0..64, offset 32 not yet removed), as GGUF
    /// packs them: in half `h` (values `128h..128h + 128`), byte `64h + 32c + l` holds
    /// group `4h + c` (value `128h + 32c + l`) in its low nibble and group `4h + c + 2`
    /// in its high nibble.
    pub(super) ql: [u8; QK_K / 2],
    /// The high two bits: byte `32h + l`, bits `2c..2c + 2`, for group `4h + c`.
    pub(super) qh: [u8; QK_K / 4],
}

impl BlockQ6K {
    /// The 32 values of group `g` (values `32g..32g + 32`, scales `2g` and `2g + 1`), one
    /// a byte (the portable kernels' view; the AVX2 ones unpack in registers).
    #[inline]
    pub(super) fn group(&self, g: usize) -> [u8; 32] {
        let (h, c) = (g / 4, g % 4);
        let (ql, qh) = (at(&self.ql, 64 * h + 32 * (c % 2)), at(&self.qh, 32 * h));
        simd::six_bits(ql, 4 * (c / 2) as u32, qh, 2 * c as u32)
    }
}

pub(crate) fn parse_q6_k(bytes: &[u8]) -> Vec<BlockQ6K> {
    collect_weights(bytes.chunks_exact(QK_K / 2 + QK_K / 4 + 16 + 2).map(|b| {
        let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
        let mut scales = [0i8; 16];
        for (d, &s) in scales.iter_mut().zip(sc) {
            *d = s as i8;
        }
        let (ql, qh) = (ql.try_into().expect("block size"), qh.try_into().expect("block size"));
        BlockQ6K { d: f16_at(b, 208), scales, ql, qh }
    }))
}

/// The tiled kernel's arithmetic (batches of 8 rows or more).
pub(crate) fn q6_k_q8_k_tiled(w: &[BlockQ6K], a: &[ActQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let mut s = 0i32;
        for g in 0..8 {
            // Lanes 0..4 are the first 16 values (one scale), 4..8 the next 16.
            let l = simd::u8_i8(&wb.group(g), at(&ab.qs, g * 32));
            for (half, lanes) in l.chunks_exact(4).enumerate() {
                let sb = 2 * g + half;
                let raw: i32 = lanes.iter().sum();
                s += wb.scales[sb] as i32 * (raw - 32 * ab.bsums[sb]);
            }
        }
        // ggml writes mul then add; GCC contracts the two vector ops into one FMA.
        acc = (s as f32 * wb.d).mul_add(ab.d, acc);
    }
    acc
}

/// The reference for `krows` (which runs in its place on AVX2 builds) and the portable path.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"), allow(dead_code))]
pub(crate) fn q6_k_q8_k(w: &[BlockQ6K], a: &[ActQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let d = ab.d * wb.d;
        let mut lanes = [0i32; 8];
        for g in 0..8 {
            // 32-value group g = 4j + k uses scales 2g (lanes 0..4) and 2g+1 (lanes 4..8).
            let p = simd::u8_i8(&wb.group(g), at(&ab.qs, g * 32));
            let (lo, hi) = (wb.scales[2 * g] as i32, wb.scales[2 * g + 1] as i32);
            for l in 0..8 {
                lanes[l] += p[l] * if l < 4 { lo } else { hi };
            }
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let offset = ab.bsums[2 * l] * wb.scales[2 * l] as i32 + ab.bsums[2 * l + 1] * wb.scales[2 * l + 1] as i32;
            *lane -= 32 * offset;
        }
        fma_lanes(&mut acc, d, lanes);
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {
    use super::super::act::{Q8KSign, quantize_q8_k};
    use super::*;

    fn act() -> (Vec<f32>, Vec<ActQ8K>) {
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect();
        let a = quantize_q8_k(&x, Q8KSign::FirstMax);
        (x, a)
    }

    fn deq_act(a: &ActQ8K) -> Vec<f32> {
        a.qs.iter().map(|&q| q as f32 * a.d).collect()
    }

    #[test]
    fn q4_k_matches_dequantized_reference() {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.25).to_le_bytes());
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend([3, 5, 7, 9, 2, 4, 6, 8, 0x11, 0x22, 0x33, 0x44]); // scales 3,5,7,9,1,2,3,4 mins 2,4,6,8,1,2,3,4
        b.extend((0..128).map(|i| (i % 16) as u8 | (((i + 5) % 16) as u8) << 4));
        let w = parse_q4_k(&b);
        assert_eq!(w[0].scales, [3, 5, 7, 9, 1, 2, 3, 4]);
        assert_eq!(w[0].mins, [2, 4, 6, 8, 1, 2, 3, 4]);
        let (_, a) = act();
        let ax = deq_act(&a[0]);
        // ggml's `dequantize_row_q4_K` reading of the packed bytes.
        let qs = &b[16..];
        let q = |i: usize| if i % 64 < 32 { qs[i / 64 * 32 + i % 32] & 0xf } else { qs[i / 64 * 32 + i % 32] >> 4 };
        assert!((0..QK_K).all(|i| w[0].sub(i / 32)[i % 32] == q(i)));
        let want: f32 = (0..QK_K)
            .map(|i| {
                let sb = i / 32;
                let wv = 0.25 * w[0].scales[sb] as f32 * q(i) as f32 - 0.5 * w[0].mins[sb] as f32;
                wv * ax[i]
            })
            .sum();
        let got = q4_k_q8_k(&w, &a, Q4KPath::Gemv);
        let got4 = q4_k_q8_k(&w, &a, Q4KPath::Gemm);
        assert!((got - got4).abs() < 1e-3 * want.abs().max(1.0));
        assert!((got - want).abs() < 1e-2 * want.abs().max(1.0), "{got} vs {want}");
    }

    #[test]
    fn q6_k_matches_dequantized_reference() {
        let mut b = Vec::new();
        b.extend((0..128).map(|i| (i * 7 % 256) as u8));
        b.extend((0..64).map(|i| (i * 13 % 256) as u8));
        b.extend((0..16).map(|i| (i as i8 - 8) as u8));
        b.extend(f16::from_f32(0.125).to_le_bytes());
        let w = parse_q6_k(&b);
        let (_, a) = act();
        let ax = deq_act(&a[0]);
        // ggml's `dequantize_row_q6_K` reading of the packed bytes.
        let (ql, qh) = (&b[..128], &b[128..192]);
        let q = |i: usize| {
            let (h, c, l) = (i / 128, i % 128 / 32, i % 32);
            let lo = ql[64 * h + 32 * (c % 2) + l] >> (4 * (c / 2)) & 0xf;
            lo | ((qh[32 * h + l] >> (2 * c)) & 3) << 4
        };
        assert!((0..QK_K).all(|i| w[0].group(i / 32)[i % 32] == q(i)));
        let want: f32 = (0..QK_K).map(|i| 0.125 * w[0].scales[i / 16] as f32 * (q(i) as f32 - 32.0) * ax[i]).sum();
        let got = q6_k_q8_k(&w, &a);
        assert!((got - want).abs() < 1e-2 * want.abs().max(1.0), "{got} vs {want}");
        let tiled = q6_k_q8_k_tiled(&w, &a);
        assert!((tiled - want).abs() < 1e-2 * want.abs().max(1.0), "{tiled} vs {want}");
    }
}
