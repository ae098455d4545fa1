//! Helpers of the quantized kernels' unit tests.

use half::f16;

/// `blocks` blocks of `size` pseudo-random bytes (`seed` shifts them), the f16 fields at
/// offsets `halves` set to small scales.
pub(super) fn block_bytes(size: usize, halves: &[usize], blocks: usize, seed: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..blocks * size).map(|i| ((i * 2654435761 + seed * 97) >> 9) as u8).collect();
    for blk in b.chunks_exact_mut(size) {
        for (k, &h) in halves.iter().enumerate() {
            blk[h..h + 2].copy_from_slice(&f16::from_f32(0.01 + 0.005 * k as f32).to_le_bytes());
        }
    }
    b
}

/// `got` equals the plain dot product of the dequantized weights within float noise.
pub(super) fn close(got: f32, weights: &[f32], acts: &[f32]) {
    let want: f64 = weights.iter().zip(acts).map(|(&w, &x)| w as f64 * x as f64).sum();
    let scale: f64 = weights.iter().zip(acts).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
    assert!((got as f64 - want).abs() <= 1e-5 * scale.max(1.0), "{got} vs {want}");
}
