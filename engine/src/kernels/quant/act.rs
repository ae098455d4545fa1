//! Activation quantization, as ggml does it on x86:
//! - Q8_0 / Q8_1 (AVX2 `quantize_row_q8_*`): scale `d = amax/127` stored as f16, values
//!   `round_half_even(x * (127/amax))`, and for Q8_1 the f16 of `d * sum(q)`;
//! - Q8_K (256 values, for the K-quants): `iscale = -127/max` where `max` is the signed
//!   value of largest magnitude, `d = 1/iscale` kept as f32, plus sums of 16. Row groups
//!   of four that feed the repacked Q4_K matmul use ggml's `quantize_mat_q8_K_4x8`, whose
//!   sign choice differs from the scalar one when both +amax and -amax occur.

use std::mem::MaybeUninit;
use std::sync::Mutex;

use half::f16;

use super::super::parallel_for;

/// Values per block of the 32-wide formats.
pub(crate) const QK: usize = 32;
/// Values per super-block of the K-quants.
pub(crate) const QK_K: usize = 256;

#[derive(Clone, Copy)]
pub(crate) struct ActQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    /// Sums of each 16 consecutive `qs`.
    pub bsums: [i32; QK_K / 16],
}

/// How a Q8_K row picks the sign of its scale (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Q8KSign {
    /// `quantize_row_q8_K_ref`: the first value of largest magnitude decides.
    FirstMax,
    /// `quantize_mat_q8_K_4x8`: negative unless only -amax occurs.
    AnyPositiveMax,
}

pub(crate) fn quantize_q8_k(xs: &[f32], sign: Q8KSign) -> Vec<ActQ8K> {
    blocks(xs, QK_K, |b| quantize_block_k(b, sign))
}

/// `f` of each `per`-value block of `x`, in order, on the worker pool when there are
/// enough of them. Blocks are independent, so the result is the same however they are
/// shared out; quantizing a prefill's activations on the calling thread alone left the
/// other waiting (4 % of SmolLM2's prefill).
fn blocks<T: Send>(x: &[f32], per: usize, f: impl Fn(&[f32]) -> T + Sync) -> Vec<T> {
    /// Blocks per task.
    const CHUNK: usize = 32;
    let n = x.len() / per;
    let mut out: Vec<T> = Vec::with_capacity(n);
    {
        let slots: Vec<Mutex<&mut [MaybeUninit<T>]>> =
            out.spare_capacity_mut()[..n].chunks_mut(CHUNK).map(Mutex::new).collect();
        parallel_for(slots.len(), x.len() * 4, |range| {
            for i in range {
                let mut slot = slots[i].lock().unwrap_or_else(|e| e.into_inner());
                for (j, o) in slot.iter_mut().enumerate() {
                    let b = i * CHUNK + j;
                    o.write(f(&x[b * per..(b + 1) * per]));
                }
            }
        });
    }
    // SAFETY: the loop above wrote each of the first `n` elements (every chunk of them
    // was handed to exactly one task, which wrote all of it) before returning.
    unsafe { out.set_len(n) };
    out
}

fn quantize_block_k(xs: &[f32], sign: Q8KSign) -> ActQ8K {
    let mut out = ActQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
    // The largest magnitude first (NaN never wins, as in ggml's `ax > amax` loop), then
    // the first value that has it: the same value ggml's one-pass loop keeps, found
    // without a branch per element.
    let amax = xs.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if amax == 0.0 {
        return out;
    }
    let iscale = match sign {
        Q8KSign::FirstMax => -127.0 / *xs.iter().find(|x| x.abs() == amax).expect("amax is a value's magnitude"),
        Q8KSign::AnyPositiveMax if xs.contains(&amax) => -127.0 / amax,
        Q8KSign::AnyPositiveMax => 127.0 / amax,
    };
    // To nearest, ties to even, as ggml's nearest_int (which adds 1.5 * 2^23).
    for (q, &x) in out.qs.iter_mut().zip(xs) {
        *q = to_i8((iscale * x).round_ties_even());
    }
    for (s, group) in out.bsums.iter_mut().zip(out.qs.chunks_exact(16)) {
        *s = group.iter().map(|&q| q as i32).sum();
    }
    out.d = 1.0 / iscale;
    out
}

#[derive(Clone, Copy)]
pub(crate) struct ActQ8 {
    /// The f16 scale, widened.
    pub d: f32,
    /// Q8_1 only: f16(d * sum(qs)), widened.
    pub s: f32,
    pub qs: [i8; QK],
}

/// A rounded value as i8: clamped to -128..=127, NaN as 0 (what a saturating cast then
/// a clamp give; |value| <= 127 here but for the last rounding). The unchecked
/// conversion lets the loops be vectorized: LLVM keeps saturating casts scalar on AVX2.
#[inline(always)]
fn to_i8(v: f32) -> i8 {
    let v = if v.is_nan() { 0.0 } else { v.clamp(-128.0, 127.0) };
    // SAFETY: `v` is finite and in -128..=127, so it is representable in i32.
    unsafe { v.to_int_unchecked::<i32>() as i8 }
}

fn quantize_block(xs: &[f32], with_sum: bool) -> ActQ8 {
    let amax = xs.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; QK];
    let mut sum = 0i32;
    for (q, &x) in qs.iter_mut().zip(xs) {
        *q = to_i8((x * id).round_ties_even());
        sum += *q as i32;
    }
    let s = if with_sum { f16::from_f32(d * sum as f32).to_f32() } else { 0.0 };
    ActQ8 { d: f16::from_f32(d).to_f32(), s, qs }
}

pub(crate) fn quantize_q8_0(x: &[f32]) -> Vec<ActQ8> {
    blocks(x, QK, |b| quantize_block(b, false))
}

pub(crate) fn quantize_q8_1(x: &[f32]) -> Vec<ActQ8> {
    blocks(x, QK, |b| quantize_block(b, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the pool (enough rows) or not, every block is the one-block quantization.
    #[test]
    fn parallel_quantization_is_blockwise() {
        let x: Vec<f32> =
            (0..300 * QK_K).map(|i| ((i * 7919 % 1013) as f32 - 500.0) / (1.0 + (i % 97) as f32)).collect();
        let q1 = quantize_q8_1(&x);
        assert_eq!(q1.len(), x.len() / QK);
        for (b, q) in q1.iter().enumerate() {
            let want = quantize_block(&x[b * QK..(b + 1) * QK], true);
            assert_eq!((q.d.to_bits(), q.s.to_bits(), q.qs), (want.d.to_bits(), want.s.to_bits(), want.qs));
        }
        let qk = quantize_q8_k(&x, Q8KSign::FirstMax);
        for (b, q) in qk.iter().enumerate() {
            let want = quantize_block_k(&x[b * QK_K..(b + 1) * QK_K], Q8KSign::FirstMax);
            assert_eq!((q.d.to_bits(), q.qs, q.bsums), (want.d.to_bits(), want.qs, want.bsums));
        }
    }

    #[test]
    fn quantizes_like_ggml() {
        let mut x = [0.0f32; QK];
        x[0] = 1.27;
        x[1] = -0.635; // exactly -63.5 after scaling: ties to even -> -64
        x[2] = 0.005; // 0.5 -> 0
        x[3] = 0.015; // 1.5 -> 2
        let b = quantize_block(&x, true);
        assert_eq!(&b.qs[..4], &[127, -64, 0, 2]);
        assert_eq!(b.d, f16::from_f32(0.01).to_f32());
        assert_eq!(b.s, f16::from_f32(0.01 * (127 - 64 + 2) as f32).to_f32());
        let z = quantize_block(&[0.0; QK], true);
        assert_eq!((z.d, z.s, z.qs), (0.0, 0.0, [0; QK]));
    }
}
