//! Q5_1 and IQ4_NL weights (32-value blocks, one f16 scale) in llama.cpp's x86 (AVX2)
//! arithmetic:
//! - Q5_1 against Q8_1 as `ggml_vec_dot_q5_1_q8_1`: eight integer lanes a block FMA'd
//!   with `d_w · d_a` into eight accumulators, `hsum_float_8`, plus the minimums'
//!   `m_w · s_a` in one scalar FMA chain (Q4_1's shape with a fifth bit);
//! - IQ4_NL against Q8_0 as ggml's repacked 8-column gemv (`gemv_q4_b32_8x8_q8_0_lut_avx`,
//!   which llama.cpp's AVX2 build takes for every IQ4_NL matrix whose row count is a
//!   multiple of 8): one exact integer per block, `acc = fma(isum, d_w · d_a, acc)` in a
//!   single f32 chain per output; other matrices as `ggml_vec_dot_iq4_nl_q8_0`: even and
//!   odd blocks FMA'd into two sets of eight lanes, added lane by lane and summed as
//!   `hsum_float_8`, an odd last block folded in after by one scalar FMA;
//! - MXFP4 against Q8_0 in exactly IQ4_NL's two kernels: ggml's AVX2 build repacks an
//!   MXFP4 matrix of 8 rows or a multiple into the same 8-column gemv template
//!   (`gemv_q4_b32_8x8_q8_0_lut_avx<block_mxfp4x8>`, dense and `mul_mat_id` alike), and
//!   `ggml_vec_dot_mxfp4_q8_0` has `ggml_vec_dot_iq4_nl_q8_0`'s shape; only the table
//!   (`MXFP4_VALUES`) and the block scale (an E8M0 power of two, `e8m0_half`) differ, so
//!   an MXFP4 block is read into an IQ4_NL block with that scale, exactly.

use half::f16;

use super::act::{ActQ8, QK};
use super::dot::{fma_lanes, hsum8};
use super::kvec::IQ4_VALUES;
use super::simd;
use super::stream::{collect_weights, prefetch};

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q5_1: weight = d · q + m, q the 5-bit value (low nibbles are elements 0..16, the
/// fifth bits in a u32).
#[derive(Clone, Copy)]
pub(crate) struct BlockQ5_1 {
    d: f32,
    m: f32,
    q: [u8; QK],
}

pub(crate) fn parse_q5_1(bytes: &[u8]) -> Vec<BlockQ5_1> {
    collect_weights(bytes.chunks_exact(2 + 2 + 4 + QK / 2).map(|b| {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let q = std::array::from_fn(|j| {
            let low = if j < QK / 2 { b[8 + j] & 0xf } else { b[8 + j - QK / 2] >> 4 };
            low | ((((qh >> j) & 1) as u8) << 4)
        });
        BlockQ5_1 { d: f16_at(b, 0), m: f16_at(b, 2), q }
    }))
}

pub(crate) fn q5_1_q8_1(w: &[BlockQ5_1], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        // ggml writes `summs += m * s`; GCC contracts it into one FMA.
        summs = wb.m.mul_add(ab.s, summs);
        fma_lanes(&mut acc, wb.d * ab.d, simd::u8_i8(&wb.q, &ab.qs));
    }
    hsum8(&acc) + summs
}

/// IQ4_NL: weight = d · `IQ4_VALUES[index]`, 4-bit indices (low nibbles are elements
/// 0..16).
#[derive(Clone, Copy)]
pub(crate) struct BlockIq4Nl {
    d: f32,
    q: [i8; QK],
}

pub(crate) fn parse_iq4_nl(bytes: &[u8]) -> Vec<BlockIq4Nl> {
    collect_weights(bytes.chunks_exact(2 + QK / 2).map(|b| {
        let q = std::array::from_fn(|j| {
            let idx = if j < QK / 2 { b[2 + j] & 0xf } else { b[2 + j - QK / 2] >> 4 };
            IQ4_VALUES[idx as usize]
        });
        BlockIq4Nl { d: f16_at(b, 0), q }
    }))
}

/// MXFP4's E2M1 values, doubled to integers (ggml's `kvalues_mxfp4`); `e8m0_half`
/// halves them back.
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 exponent byte as `2^(e - 127) / 2`, exact in f32 (subnormal for `e` < 2), as
/// ggml's `ggml_e8m0_to_fp32_half`.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// MXFP4 blocks (the exponent byte, then 16 bytes of nibbles: low nibbles are elements
/// 0..16) as IQ4_NL blocks of the same values.
pub(crate) fn parse_mxfp4(bytes: &[u8]) -> Vec<BlockIq4Nl> {
    collect_weights(bytes.chunks_exact(1 + QK / 2).map(|b| {
        let q = std::array::from_fn(|j| {
            let idx = if j < QK / 2 { b[1 + j] & 0xf } else { b[1 + j - QK / 2] >> 4 };
            MXFP4_VALUES[idx as usize]
        });
        BlockIq4Nl { d: e8m0_half(b[0]), q }
    }))
}

/// The values of a row of MXFP4 blocks, as ggml's `dequantize_row_mxfp4`.
pub(crate) fn dequantize_mxfp4(bytes: &[u8]) -> Vec<f32> {
    parse_mxfp4(bytes).iter().flat_map(|b| b.q.map(|q| b.d * q as f32)).collect()
}

/// The values of a row of IQ4_NL blocks, as ggml's `dequantize_row_iq4_nl`.
pub(crate) fn dequantize_iq4_nl(bytes: &[u8]) -> Vec<f32> {
    parse_iq4_nl(bytes).iter().flat_map(|b| b.q.map(|q| b.d * q as f32)).collect()
}

/// Which of ggml's IQ4_NL kernels a matrix goes through (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Iq4NlPath {
    Repacked,
    VecDot,
}

pub(crate) fn iq4_nl_q8_0(w: &[BlockIq4Nl], a: &[ActQ8], path: Iq4NlPath) -> f32 {
    if path == Iq4NlPath::VecDot {
        return iq4_nl_vec_dot(w, a);
    }
    let mut acc = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let isum: i32 = simd::i8_i8(&wb.q, &ab.qs).iter().sum();
        acc = (isum as f32).mul_add(wb.d * ab.d, acc);
    }
    acc
}

fn iq4_nl_vec_dot(w: &[BlockIq4Nl], a: &[ActQ8]) -> f32 {
    let (mut even, mut odd) = ([0.0f32; 8], [0.0f32; 8]);
    let pairs = w.len() / 2;
    for (wp, ap) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        prefetch(&wp[0]);
        fma_lanes(&mut even, ap[0].d * wp[0].d, simd::i8_i8(&wp[0].q, &ap[0].qs));
        fma_lanes(&mut odd, ap[1].d * wp[1].d, simd::i8_i8(&wp[1].q, &ap[1].qs));
    }
    let mut sum = hsum8(&std::array::from_fn(|l| even[l] + odd[l]));
    if let (Some(wb), Some(ab)) = (w.get(2 * pairs), a.get(2 * pairs)) {
        let isum: i32 = simd::i8_i8(&wb.q, &ab.qs).iter().sum();
        // ggml writes `sumf += d * isum`; GCC contracts it into one FMA.
        sum = (ab.d * wb.d).mul_add(isum as f32, sum);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::super::act::{quantize_q8_0, quantize_q8_1};
    use super::super::testing::{block_bytes, close};
    use super::*;

    fn acts() -> Vec<f32> {
        (0..4 * QK).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect()
    }

    #[test]
    fn q5_1_matches_plain_dot() {
        let b = block_bytes(24, &[0, 2], 4, 0);
        let a = quantize_q8_1(&acts());
        // Per block, d·q against the dequantized activations, then the minimum against
        // the block's sum as ggml keeps it (`s`, rounded to f16): one extra product.
        let mut w = Vec::new();
        let mut x = Vec::new();
        for (b, ab) in b.chunks_exact(24).zip(&a) {
            let qh = u32::from_le_bytes(b[4..8].try_into().unwrap());
            for j in 0..QK {
                let nib = if j < 16 { b[8 + j] & 0xf } else { b[8 + j - 16] >> 4 };
                w.push(f16_at(b, 0) * (nib as u32 | (((qh >> j) & 1) << 4)) as f32);
                x.push(ab.qs[j] as f32 * ab.d);
            }
            w.push(f16_at(b, 2));
            x.push(ab.s);
        }
        close(q5_1_q8_1(&parse_q5_1(&b), &a), &w, &x);
    }

    #[test]
    fn iq4_nl_matches_plain_dot() {
        let b = block_bytes(18, &[0], 4, 0);
        let a = quantize_q8_0(&acts());
        let x: Vec<f32> = a.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect();
        let w: Vec<f32> = b
            .chunks_exact(18)
            .flat_map(|b| {
                (0..QK).map(move |j| {
                    let idx = if j < 16 { b[2 + j] & 0xf } else { b[2 + j - 16] >> 4 };
                    f16_at(b, 0) * IQ4_VALUES[idx as usize] as f32
                })
            })
            .collect();
        for path in [Iq4NlPath::Repacked, Iq4NlPath::VecDot] {
            close(iq4_nl_q8_0(&parse_iq4_nl(&b), &a, path), &w, &x);
            // An odd block count: the vec-dot's scalar last block.
            let n = 3 * QK;
            close(iq4_nl_q8_0(&parse_iq4_nl(&b[..3 * 18]), &a[..3], path), &w[..n], &x[..n]);
        }
    }

    #[test]
    fn e8m0_half_is_half_a_power_of_two_down_to_the_subnormals() {
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(120), 2f32.powi(-8));
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
    }

    /// A block by hand: exponent 126 (scale 2^-1 / 2 = 0.25), nibbles 0..15 low and
    /// 15..0 high: element j < 16 is `MXFP4_VALUES[j] / 4`, element 16 + j is
    /// `MXFP4_VALUES[15 - j] / 4`.
    #[test]
    fn mxfp4_blocks_read_as_their_table_values_times_the_half_scale() {
        let mut b = vec![126u8];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let want: Vec<f32> =
            [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.5, -2.0, -3.0]
                .iter()
                .chain(
                    [-3.0, -2.0, -1.5, -1.0, -0.75, -0.5, -0.25, 0.0, 3.0, 2.0, 1.5, 1.0, 0.75, 0.5, 0.25, 0.0].iter(),
                )
                .copied()
                .collect();
        assert_eq!(dequantize_mxfp4(&b), want);
        // Against Q8_0 activations of all ones (q = 127, d = 1/127 as f16): the
        // integer sum of the block above is 127 × (sum of the table − its mirror) = 0.
        let a = quantize_q8_0(&[1.0f32; QK]);
        assert_eq!(a[0].qs, [127i8; QK]);
        for path in [Iq4NlPath::Repacked, Iq4NlPath::VecDot] {
            assert_eq!(iq4_nl_q8_0(&parse_mxfp4(&b), &a, path), 0.0);
        }
        // Exponent 128 (scale 1), nibbles 0..8 twice in each half: the values
        // 0, 1, 2, 3, 4, 6, 8, 12 four times, 144 in all; one block is one product.
        let mut pos = vec![128u8];
        pos.extend((0..16u8).map(|j| (j % 8) | ((j % 8) << 4)));
        for path in [Iq4NlPath::Repacked, Iq4NlPath::VecDot] {
            assert_eq!(iq4_nl_q8_0(&parse_mxfp4(&pos), &a, path), (127 * 144) as f32 * a[0].d);
        }
        // Several blocks, against varied activations, within float noise of the plain dot.
        let mut many = Vec::new();
        for blk in 0..4u8 {
            many.push(118 + blk);
            many.extend((0..16u8).map(|j| j.wrapping_mul(7).wrapping_add(blk * 3)));
        }
        let acts = acts();
        let qa = quantize_q8_0(&acts);
        let x: Vec<f32> = qa.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect();
        for path in [Iq4NlPath::Repacked, Iq4NlPath::VecDot] {
            close(iq4_nl_q8_0(&parse_mxfp4(&many), &qa, path), &dequantize_mxfp4(&many), &x);
        }
    }
}
