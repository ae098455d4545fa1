//! BF16 weights in llama.cpp's x86 (AVX2) arithmetic for one activation row: the
//! activations rounded to bf16 (`GGML_FP32_TO_BF16`: to nearest, ties to even; NaN kept
//! quiet), then `ggml_vec_dot_bf16`: four chains of eight f32 lanes, each step of 32
//! values one FMA per chain (GCC contracts ggml's mul + add), the chains added as
//! `(c1 + c3) + (c2 + c4)` and the eight lanes as `hsum_float_8` (rows of a length that
//! is not a multiple of 32, whose tail ggml adds in f64, stay with candle). With two
//! rows or more llama.cpp takes tinyBLAS; corral's batch-invariant numerics keep this
//! one-row order for every row.

use super::dot::hsum8;
use super::stream::{collect_weights, prefetch};

/// Values per step of the kernel (four chains of eight).
pub(crate) const STEP: usize = 32;

/// 32 weights as bf16 bit patterns.
pub(crate) type BlockBf16 = [u16; STEP];

pub(crate) fn parse_bf16(bytes: &[u8]) -> Vec<BlockBf16> {
    collect_weights(
        bytes.chunks_exact(2 * STEP).map(|b| std::array::from_fn(|i| u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
    )
}

/// `GGML_FP32_TO_BF16` then back to f32: the value ggml's kernel multiplies by.
pub(crate) fn round_bf16(x: f32) -> f32 {
    let u = x.to_bits();
    let bits = if u & 0x7fff_ffff > 0x7f80_0000 { (u >> 16) | 64 } else { (u + (0x7fff + ((u >> 16) & 1))) >> 16 };
    f32::from_bits(bits << 16)
}

/// Activations for the kernel: every value rounded to bf16, in steps of 32.
pub(crate) fn acts_bf16(x: &[f32]) -> Vec<[f32; STEP]> {
    x.chunks_exact(STEP).map(|c| std::array::from_fn(|i| round_bf16(c[i]))).collect()
}

#[inline]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

pub(crate) fn bf16_dot(w: &[BlockBf16], a: &[[f32; STEP]]) -> f32 {
    let mut c = [[0.0f32; 8]; 4];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        for (q, chain) in c.iter_mut().enumerate() {
            for (l, lane) in chain.iter_mut().enumerate() {
                let i = 8 * q + l;
                *lane = widen(wb[i]).mul_add(ab[i], *lane);
            }
        }
    }
    hsum8(&std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_like_ggml() {
        // Halfway between two bf16 values: to the even one.
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8000)), f32::from_bits(0x3f80_0000));
        assert_eq!(round_bf16(f32::from_bits(0x3f81_8000)), f32::from_bits(0x3f82_0000));
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8001)), f32::from_bits(0x3f81_0000));
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn matches_plain_dot() {
        let k = 4 * STEP;
        let x: Vec<f32> = (0..k).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect();
        let bits: Vec<u16> =
            (0..k).map(|i| round_bf16(((i * 31 % 89) as f32 - 44.0) / 300.0).to_bits() as u16).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let a = acts_bf16(&x);
        let got = bf16_dot(&parse_bf16(&bytes), &a);
        let flat: Vec<f32> = a.iter().flatten().copied().collect();
        let want: f64 = bits.iter().zip(&flat).map(|(&b, &x)| widen(b) as f64 * x as f64).sum();
        let scale: f64 = bits.iter().zip(&flat).map(|(&b, &x)| (widen(b) as f64 * x as f64).abs()).sum();
        assert!((got as f64 - want).abs() <= 1e-6 * scale, "{got} vs {want}");
    }
}
