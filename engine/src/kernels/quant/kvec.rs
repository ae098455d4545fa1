//! Q2_K, Q3_K, Q5_K and IQ4_XS weights (256-value super-blocks) against Q8_K
//! activations, in the arithmetic of ggml's AVX2 `ggml_vec_dot_*_q8_K` (the path
//! llama.cpp's x86 build takes for these types one row at a time: none is repacked on
//! AVX2). Per super-block, eight exact i32 lanes — lane `l` sums bytes `4l..4l+4` of
//! every 32-value group, each group's lanes times its sub-block scale — are FMA'd into
//! eight f32 accumulators, summed at the end as `hsum_float_8`. Where the format has
//! minimums, Q5_K folds their exact integer into one scalar FMA chain added after the
//! horizontal sum; Q2_K folds eight integer lanes of them into the same accumulators,
//! before the scales' lanes of the same block.
//!
//! Blocks are unpacked at load into one byte per value (the `q` arrays), so a dot is
//! one integer kernel per 32 values (`simd`), whatever the bit packing.

use super::act::{ActQ8K, QK_K};
use super::dot::{fma_lanes, hsum8};
use super::kquants::{f16_at, scale_min_k4};
use super::simd;
use super::stream::{collect_weights, prefetch};

/// 32 values starting at `i` as a fixed-size array.
#[inline]
fn at<T>(v: &[T; QK_K], i: usize) -> &[T; 32] {
    v[i..i + 32].try_into().expect("in bounds")
}

/// Eight lanes of `Σ_g scale(g, half) · lanes_g`, `lanes_g` the integer kernel of the
/// 32-value group `g`; lanes 0..4 are its first 16 values, 4..8 the next 16.
#[inline]
fn scaled_lanes(dot: impl Fn(usize) -> [i32; 8], scale: impl Fn(usize, usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for g in 0..QK_K / 32 {
        let (p, lo, hi) = (dot(g), scale(g, 0), scale(g, 1));
        for l in 0..8 {
            lanes[l] += p[l] * if l < 4 { lo } else { hi };
        }
    }
    lanes
}

/// Q2_K: 16 sub-blocks of 16, 2-bit values, 4-bit scales and minimums.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ2K {
    d: f32,
    dmin: f32,
    scales: [u8; 16],
    mins: [u8; 16],
    q: [u8; QK_K],
}

pub(crate) fn parse_q2_k(bytes: &[u8]) -> Vec<BlockQ2K> {
    collect_weights(bytes.chunks_exact(16 + QK_K / 4 + 4).map(|b| {
        let mut q = [0u8; QK_K];
        for (i, v) in q.iter_mut().enumerate() {
            // Value 128j + 32p + l is bits 2p..2p+2 of byte 32j + l.
            let (j, p, l) = (i / 128, i / 32 % 4, i % 32);
            *v = (b[16 + 32 * j + l] >> (2 * p)) & 3;
        }
        BlockQ2K {
            d: f16_at(b, 16 + 64),
            dmin: f16_at(b, 16 + 66),
            scales: std::array::from_fn(|i| b[i] & 0xf),
            mins: std::array::from_fn(|i| b[i] >> 4),
            q,
        }
    }))
}

pub(crate) fn q2_k_q8_k(w: &[BlockQ2K], a: &[ActQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let mins: [i32; 8] = std::array::from_fn(|l| {
            wb.mins[2 * l] as i32 * ab.bsums[2 * l] + wb.mins[2 * l + 1] as i32 * ab.bsums[2 * l + 1]
        });
        fma_lanes(&mut acc, -ab.d * wb.dmin, mins);
        let lanes =
            scaled_lanes(|g| simd::u8_i8(at(&wb.q, 32 * g), at(&ab.qs, 32 * g)), |g, h| wb.scales[2 * g + h] as i32);
        fma_lanes(&mut acc, ab.d * wb.d, lanes);
    }
    hsum8(&acc)
}

/// Q3_K: 16 sub-blocks of 16, signed 3-bit values (-4..=3), signed 6-bit scales.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ3K {
    d: f32,
    scales: [i8; 16],
    q: [i8; QK_K],
}

pub(crate) fn parse_q3_k(bytes: &[u8]) -> Vec<BlockQ3K> {
    collect_weights(bytes.chunks_exact(QK_K / 8 + QK_K / 4 + 12 + 2).map(|b| {
        let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
        let mut q = [0i8; QK_K];
        for (i, v) in q.iter_mut().enumerate() {
            // Value 128j + 32p + l: bits 2p..2p+2 of byte 32j + l, and bit 4j + p of
            // hmask[l], which when clear takes 4 off.
            let (j, p, l) = (i / 128, i / 32 % 4, i % 32);
            let low = (qs[32 * j + l] >> (2 * p)) & 3;
            let high = (hmask[l] >> (4 * j + p)) & 1;
            *v = (low + 4 * high) as i8 - 4;
        }
        // Sixteen 6-bit scales: low 4 bits from the nibbles of bytes 0..8, high 2 bits
        // from bytes 8..12 (ggml's kmask unpacking), then 32 off.
        let scales = std::array::from_fn(|i| {
            let low = if i < 8 { sc[i] & 0xf } else { sc[i - 8] >> 4 };
            let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        });
        BlockQ3K { d: f16_at(b, 108), scales, q }
    }))
}

pub(crate) fn q3_k_q8_k(w: &[BlockQ3K], a: &[ActQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let lanes =
            scaled_lanes(|g| simd::i8_i8(at(&wb.q, 32 * g), at(&ab.qs, 32 * g)), |g, h| wb.scales[2 * g + h] as i32);
        fma_lanes(&mut acc, ab.d * wb.d, lanes);
    }
    hsum8(&acc)
}

/// Q5_K: 8 sub-blocks of 32, 5-bit values, 6-bit scales and minimums (Q4_K's packing).
#[derive(Clone, Copy)]
pub(crate) struct BlockQ5K {
    d: f32,
    dmin: f32,
    scales: [u8; 8],
    mins: [u8; 8],
    q: [u8; QK_K],
}

pub(crate) fn parse_q5_k(bytes: &[u8]) -> Vec<BlockQ5K> {
    collect_weights(bytes.chunks_exact(4 + 12 + QK_K / 8 + QK_K / 2).map(|b| {
        let (scales, mins) = scale_min_k4(&b[4..16]);
        let (qh, qs) = (&b[16..48], &b[48..]);
        let mut q = [0u8; QK_K];
        for (i, v) in q.iter_mut().enumerate() {
            // Value 64j + 32h + l: nibble h of byte 32j + l, fifth bit 2j + h of qh[l].
            let (j, h, l) = (i / 64, i / 32 % 2, i % 32);
            let low = (qs[32 * j + l] >> (4 * h)) & 0xf;
            *v = low | (((qh[l] >> (2 * j + h)) & 1) << 4);
        }
        BlockQ5K { d: f16_at(b, 0), dmin: f16_at(b, 2), scales, mins, q }
    }))
}

pub(crate) fn q5_k_q8_k(w: &[BlockQ5K], a: &[ActQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let imin: i32 = (0..8).map(|sb| wb.mins[sb] as i32 * (ab.bsums[2 * sb] + ab.bsums[2 * sb + 1])).sum();
        // ggml writes `summs += dmin * isum`; GCC contracts it into one FMA.
        summs = (-ab.d * wb.dmin).mul_add(imin as f32, summs);
        let lanes = scaled_lanes(|g| simd::u8_i8(at(&wb.q, 32 * g), at(&ab.qs, 32 * g)), |g, _| wb.scales[g] as i32);
        fma_lanes(&mut acc, ab.d * wb.d, lanes);
    }
    hsum8(&acc) + summs
}

/// IQ4_XS: 8 sub-blocks of 32, 4-bit indices into the IQ4_NL table, signed 6-bit scales.
#[derive(Clone, Copy)]
pub(crate) struct BlockIq4Xs {
    d: f32,
    scales: [i8; 8],
    q: [i8; QK_K],
}

/// IQ4_NL's and IQ4_XS's 16 values (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

pub(crate) fn parse_iq4_xs(bytes: &[u8]) -> Vec<BlockIq4Xs> {
    collect_weights(bytes.chunks_exact(2 + 2 + 4 + QK_K / 2).map(|b| {
        let high = u16::from_le_bytes([b[2], b[3]]);
        let (low, qs) = (&b[4..8], &b[8..]);
        let scales = std::array::from_fn(|s| {
            let lo = (low[s / 2] >> (4 * (s % 2))) & 0xf;
            let hi = ((high >> (2 * s)) & 3) as u8;
            (lo | (hi << 4)) as i8 - 32
        });
        let mut q = [0i8; QK_K];
        for (i, v) in q.iter_mut().enumerate() {
            // Sub-block s: low nibbles of its 16 bytes are values 0..16, high ones 16..32.
            let (s, h, l) = (i / 32, i / 16 % 2, i % 16);
            *v = IQ4_VALUES[((qs[16 * s + l] >> (4 * h)) & 0xf) as usize];
        }
        BlockIq4Xs { d: f16_at(b, 0), scales, q }
    }))
}

/// The values of a row of IQ4_XS blocks, as ggml's `dequantize_row_iq4_xs`: each
/// sub-block's `d · scale` first, then times the table value.
pub(crate) fn dequantize_iq4_xs(bytes: &[u8]) -> Vec<f32> {
    parse_iq4_xs(bytes)
        .iter()
        .flat_map(|b| (0..QK_K).map(move |i| (b.d * b.scales[i / 32] as f32) * b.q[i] as f32))
        .collect()
}

pub(crate) fn iq4_xs_q8_k(w: &[BlockIq4Xs], a: &[ActQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        let lanes = scaled_lanes(|g| simd::i8_i8(at(&wb.q, 32 * g), at(&ab.qs, 32 * g)), |g, _| wb.scales[g] as i32);
        fma_lanes(&mut acc, wb.d * ab.d, lanes);
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {
    use super::super::act::{Q8KSign, quantize_q8_k};
    use super::super::testing::{block_bytes, close};
    use super::*;

    /// Activations of two super-blocks and their dequantized values.
    fn act() -> (Vec<ActQ8K>, Vec<f32>) {
        let x: Vec<f32> = (0..2 * QK_K).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect();
        let a = quantize_q8_k(&x, Q8KSign::FirstMax);
        let deq = a.iter().flat_map(|b| b.qs.iter().map(move |&q| q as f32 * b.d)).collect();
        (a, deq)
    }

    /// Dequantization straight from the bytes, as ggml's `dequantize_row_*` reads them.
    fn deq_q2_k(b: &[u8]) -> Vec<f32> {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        (0..QK_K)
            .map(|i| {
                let (j, p, l) = (i / 128, i / 32 % 4, i % 32);
                let sc = b[8 * j + 2 * p + l / 16];
                let q = (b[16 + 32 * j + l] >> (2 * p)) & 3;
                d * (sc & 0xf) as f32 * q as f32 - dmin * (sc >> 4) as f32
            })
            .collect()
    }

    #[test]
    fn q2_k_matches_plain_dot() {
        let b = block_bytes(84, &[80, 82], 2, 1);
        let (a, x) = act();
        let w: Vec<f32> = b.chunks_exact(84).flat_map(deq_q2_k).collect();
        close(q2_k_q8_k(&parse_q2_k(&b), &a), &w, &x);
    }

    #[test]
    fn q3_k_matches_plain_dot() {
        let b = block_bytes(110, &[108], 2, 2);
        let (a, x) = act();
        let w: Vec<f32> = b
            .chunks_exact(110)
            .flat_map(|b| {
                // ggml's scale unpacking on four u32 words.
                let word = |i: usize| u32::from_le_bytes(b[96 + 4 * i..100 + 4 * i].try_into().unwrap());
                let (a0, a1, t) = (word(0), word(1), word(2));
                let (m1, m2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
                let aux = [
                    (a0 & m2) | ((t & m1) << 4),
                    (a1 & m2) | (((t >> 2) & m1) << 4),
                    ((a0 >> 4) & m2) | (((t >> 4) & m1) << 4),
                    ((a1 >> 4) & m2) | (((t >> 6) & m1) << 4),
                ];
                let sc: Vec<i32> = aux.iter().flat_map(|w| w.to_le_bytes()).map(|s| s as i8 as i32 - 32).collect();
                let d = f16_at(b, 108);
                (0..QK_K).map(move |i| {
                    let (j, p, l) = (i / 128, i / 32 % 4, i % 32);
                    let q = ((b[32 + 32 * j + l] >> (2 * p)) & 3) as i32;
                    let q = q - if b[l] & (1 << (4 * j + p)) != 0 { 0 } else { 4 };
                    d * sc[8 * j + 2 * p + l / 16] as f32 * q as f32
                })
            })
            .collect();
        close(q3_k_q8_k(&parse_q3_k(&b), &a), &w, &x);
    }

    #[test]
    fn q5_k_matches_plain_dot() {
        let b = block_bytes(176, &[0, 2], 2, 3);
        let (a, x) = act();
        let w: Vec<f32> = b
            .chunks_exact(176)
            .flat_map(|b| {
                let (sc, mn) = scale_min_k4(&b[4..16]);
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                (0..QK_K).map(move |i| {
                    let (j, l) = (i / 64, i % 32);
                    let sb = i / 32;
                    let nib = if i % 64 < 32 { b[48 + 32 * j + l] & 0xf } else { b[48 + 32 * j + l] >> 4 };
                    let q = nib as u32 + if b[16 + l] & (1 << sb) != 0 { 16 } else { 0 };
                    d * sc[sb] as f32 * q as f32 - dmin * mn[sb] as f32
                })
            })
            .collect();
        close(q5_k_q8_k(&parse_q5_k(&b), &a), &w, &x);
    }

    #[test]
    fn iq4_xs_matches_plain_dot() {
        let b = block_bytes(136, &[0], 2, 4);
        let (a, x) = act();
        let w: Vec<f32> = b
            .chunks_exact(136)
            .flat_map(|b| {
                let high = u16::from_le_bytes([b[2], b[3]]) as i32;
                (0..QK_K).map(move |i| {
                    let s = i / 32;
                    let ls = (((b[4 + s / 2] >> (4 * (s % 2))) & 0xf) as i32 | (((high >> (2 * s)) & 3) << 4)) - 32;
                    let byte = b[8 + 16 * s + i % 16];
                    let idx = if i % 32 < 16 { byte & 0xf } else { byte >> 4 };
                    f16_at(b, 0) * ls as f32 * IQ4_VALUES[idx as usize] as f32
                })
            })
            .collect();
        close(iq4_xs_q8_k(&parse_iq4_xs(&b), &a), &w, &x);
    }
}
