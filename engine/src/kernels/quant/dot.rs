//! Weight blocks as stored in GGUF and their dot products with quantized activations,
//! in ggml's AVX2 order: per block, eight i32 lanes each summing four consecutive
//! products; `acc[lane] = fma(d_w * d_a, lane_sum, acc[lane])`; then
//! `((a4+a0)+(a6+a2)) + ((a5+a1)+(a7+a3))`.

use half::f16;

use super::act::{ActQ8, QK};

/// Q4_1: 32 4-bit values `q`, weight = d * q + m. Low nibbles are elements 0..16.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ4_1 {
    d: f32,
    m: f32,
    qs: [u8; QK / 2],
}

/// Q5_0: 32 5-bit values, weight = d * (q - 16), held here as the signed result.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ5_0 {
    d: f32,
    qs: [i8; QK],
}

pub(crate) fn parse_q5_0(bytes: &[u8]) -> Vec<BlockQ5_0> {
    bytes
        .chunks_exact(2 + 4 + QK / 2)
        .map(|b| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let nib = &b[6..];
            let mut qs = [0i8; QK];
            for (j, q) in qs.iter_mut().enumerate() {
                let lo = if j < QK / 2 { nib[j] & 0xf } else { nib[j - QK / 2] >> 4 };
                let hi = ((qh >> j) & 1) as u8;
                *q = (lo | (hi << 4)) as i8 - 16;
            }
            BlockQ5_0 { d: f16_at(b, 0), qs }
        })
        .collect()
}

pub(crate) fn q5_0_q8_0(w: &[BlockQ5_0], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        let mut x = [0i32; QK];
        for (xi, &q) in x.iter_mut().zip(&wb.qs) {
            *xi = q as i32;
        }
        let d = wb.d * ab.d;
        let s = lane_sums(&x, &ab.qs);
        for l in 0..8 {
            acc[l] = d.mul_add(s[l] as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// Q8_0: 32 signed bytes, weight = d * q.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ8_0 {
    d: f32,
    qs: [i8; QK],
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

pub(crate) fn parse_q4_1(bytes: &[u8]) -> Vec<BlockQ4_1> {
    bytes
        .chunks_exact(4 + QK / 2)
        .map(|b| {
            let mut qs = [0u8; QK / 2];
            qs.copy_from_slice(&b[4..]);
            BlockQ4_1 { d: f16_at(b, 0), m: f16_at(b, 2), qs }
        })
        .collect()
}

pub(crate) fn parse_q8_0(bytes: &[u8]) -> Vec<BlockQ8_0> {
    bytes
        .chunks_exact(2 + QK)
        .map(|b| {
            let mut qs = [0i8; QK];
            for (q, &v) in qs.iter_mut().zip(&b[2..]) {
                *q = v as i8;
            }
            BlockQ8_0 { d: f16_at(b, 0), qs }
        })
        .collect()
}

#[inline]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))
}

#[inline]
fn lane_sums(x: &[i32; QK], y: &[i8; QK]) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (l, sum) in s.iter_mut().enumerate() {
        for e in 0..4 {
            *sum += x[4 * l + e] * y[4 * l + e] as i32;
        }
    }
    s
}

pub(crate) fn q4_1_q8_1(w: &[BlockQ4_1], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        summs = wb.m.mul_add(ab.s, summs);
        let mut x = [0i32; QK];
        for i in 0..QK / 2 {
            x[i] = (wb.qs[i] & 0x0f) as i32;
            x[i + QK / 2] = (wb.qs[i] >> 4) as i32;
        }
        let d = wb.d * ab.d;
        let s = lane_sums(&x, &ab.qs);
        for l in 0..8 {
            acc[l] = d.mul_add(s[l] as f32, acc[l]);
        }
    }
    hsum8(&acc) + summs
}

pub(crate) fn q8_0_q8_0(w: &[BlockQ8_0], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        let mut x = [0i32; QK];
        for (xi, &q) in x.iter_mut().zip(&wb.qs) {
            *xi = q as i32;
        }
        let d = wb.d * ab.d;
        let s = lane_sums(&x, &ab.qs);
        for l in 0..8 {
            acc[l] = d.mul_add(s[l] as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {
    use super::super::act::{quantize_q8_0, quantize_q8_1};
    use super::*;

    /// Dequantize-and-multiply reference (exact up to activation quantization).
    #[test]
    fn dots_match_dequantized_reference() {
        let k = 64;
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0).collect();
        // Q4_1 weights: d=0.5, m=-2, q = i % 16.
        let mut bytes = Vec::new();
        for _ in 0..k / QK {
            bytes.extend(f16::from_f32(0.5).to_le_bytes());
            bytes.extend(f16::from_f32(-2.0).to_le_bytes());
            for i in 0..QK / 2 {
                bytes.push((i as u8 % 16) | (((i as u8 + 3) % 16) << 4));
            }
        }
        let w = parse_q4_1(&bytes);
        let wf: Vec<f32> = (0..k)
            .map(|i| {
                let j = i % QK;
                let q = if j < 16 { j % 16 } else { (j - 16 + 3) % 16 };
                0.5 * q as f32 - 2.0
            })
            .collect();
        let a = quantize_q8_1(&x);
        let deq: Vec<f32> = a.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
        let want: f32 = wf.iter().zip(&deq).map(|(a, b)| a * b).sum();
        assert!((q4_1_q8_1(&w, &a) - want).abs() < 0.05, "{} vs {want}", q4_1_q8_1(&w, &a));

        let mut bytes = Vec::new();
        for _ in 0..k / QK {
            bytes.extend(f16::from_f32(0.25).to_le_bytes());
            bytes.extend((0..QK).map(|i| (i as i8 - 16) as u8));
        }
        let w = parse_q8_0(&bytes);
        let a = quantize_q8_0(&x);
        let deq: Vec<f32> = a.iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect();
        let want: f32 = (0..k).map(|i| 0.25 * ((i % QK) as f32 - 16.0) * deq[i]).sum();
        assert!((q8_0_q8_0(&w, &a) - want).abs() < 1e-3);
    }
}
