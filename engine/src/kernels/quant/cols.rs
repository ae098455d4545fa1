//! One activation row against `C` weight columns at once: the decode kernels. Each
//! column's arithmetic is exactly the one-column kernel's (`super::dot`); what changes
//! is that `C` independent FMA chains and `C` weight streams are in flight together, so
//! the loop is no longer bound by one chain's FMA latency or one stream's memory
//! latency, and the activation block is loaded once for all of them.

use super::act::ActQ8;
use super::dot::{BlockQ4_1, BlockQ5_0, BlockQ8_0};

/// `C` weight columns (each `[k_blocks]`) against one activation row.
pub(crate) type ColsN<W, const C: usize> = fn([&[W]; C], &[ActQ8]) -> [f32; C];

pub(crate) fn q4_1_q8_1<const C: usize>(w: [&[BlockQ4_1]; C], a: &[ActQ8]) -> [f32; C] {
    imp::q4_1_q8_1(w, a)
}

pub(crate) fn q8_0_q8_0<const C: usize>(w: [&[BlockQ8_0]; C], a: &[ActQ8]) -> [f32; C] {
    imp::q8_0_q8_0(w, a)
}

pub(crate) fn q5_0_q8_0<const C: usize>(w: [&[BlockQ5_0]; C], a: &[ActQ8]) -> [f32; C] {
    imp::q5_0_q8_0(w, a)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod imp {
    use std::arch::x86_64::*;

    use super::super::dot::xn::{finish, step};
    use super::super::stream::prefetch_group;
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, BlockQ8_0};

    // SAFETY (every block here): AVX2 and FMA are target features of this build; loads
    // read exactly the 16 or 32 bytes of the fixed-size arrays they are given, stores
    // write an [f32; 8].

    fn blocks<W, const C: usize>(w: &[&[W]; C], a: &[ActQ8]) -> usize {
        w.iter().map(|w| w.len()).fold(a.len(), usize::min)
    }

    pub(super) fn q4_1_q8_1<const C: usize>(w: [&[BlockQ4_1]; C], a: &[ActQ8]) -> [f32; C] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; C];
        let mut summs = [0.0f32; C];
        for (b, ab) in a[..blocks(&w, a)].iter().enumerate() {
            unsafe {
                let y = _mm256_loadu_si256(ab.qs.as_ptr().cast());
                prefetch_group(&w, b);
                for c in 0..C {
                    let wb = &w[c][b];
                    summs[c] = wb.m.to_f32().mul_add(ab.s, summs[c]);
                    let lo = _mm_loadu_si128(wb.qs.as_ptr().cast());
                    let x = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(lo, 4), lo), _mm256_set1_epi8(0x0f));
                    acc[c] = step(acc[c], wb.d.to_f32() * ab.d, x, y);
                }
            }
        }
        finish(acc, summs)
    }

    /// Signed weights against signed activations: |x| made unsigned, its sign moved onto y.
    #[inline(always)]
    unsafe fn signed(acc: __m256, d: f32, qs: &[i8; 32], y: __m256i) -> __m256 {
        unsafe {
            let x = _mm256_loadu_si256(qs.as_ptr().cast());
            step(acc, d, _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
        }
    }

    /// The signed-weight formats: `scale_qs` gives a block's f32 scale and its 32 values.
    #[inline(always)]
    fn signed_cols<W, const C: usize>(
        w: [&[W]; C],
        a: &[ActQ8],
        scale_qs: impl Fn(&W) -> (f32, &[i8; 32]),
    ) -> [f32; C] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; C];
        for (b, ab) in a[..blocks(&w, a)].iter().enumerate() {
            unsafe {
                let y = _mm256_loadu_si256(ab.qs.as_ptr().cast());
                prefetch_group(&w, b);
                for c in 0..C {
                    let wb = &w[c][b];
                    let (d, qs) = scale_qs(wb);
                    acc[c] = signed(acc[c], d * ab.d, qs, y);
                }
            }
        }
        finish(acc, [0.0; C])
    }

    pub(super) fn q8_0_q8_0<const C: usize>(w: [&[BlockQ8_0]; C], a: &[ActQ8]) -> [f32; C] {
        signed_cols(w, a, |wb| (wb.d.to_f32(), &wb.qs))
    }

    pub(super) fn q5_0_q8_0<const C: usize>(w: [&[BlockQ5_0]; C], a: &[ActQ8]) -> [f32; C] {
        signed_cols(w, a, |wb| (wb.d, &wb.qs))
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
mod imp {
    use super::super::dot;
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, BlockQ8_0};

    pub(super) fn q4_1_q8_1<const C: usize>(w: [&[BlockQ4_1]; C], a: &[ActQ8]) -> [f32; C] {
        w.map(|w| dot::q4_1_q8_1(w, a))
    }
    pub(super) fn q8_0_q8_0<const C: usize>(w: [&[BlockQ8_0]; C], a: &[ActQ8]) -> [f32; C] {
        w.map(|w| dot::q8_0_q8_0(w, a))
    }
    pub(super) fn q5_0_q8_0<const C: usize>(w: [&[BlockQ5_0]; C], a: &[ActQ8]) -> [f32; C] {
        w.map(|w| dot::q5_0_q8_0(w, a))
    }
}

#[cfg(test)]
mod tests {
    use super::super::act::{QK, quantize_q8_0, quantize_q8_1};
    use super::super::dot;
    use super::*;

    fn bytes(blocks: usize, per: usize, seed: usize) -> Vec<u8> {
        // Scales kept small and finite (high bits of the f16 masked), quants anything.
        (0..blocks * per).map(|i| ((i * 31 + seed * 97) % 251) as u8 & if i % per < 4 { 0x3b } else { 0xff }).collect()
    }

    fn check<W, const C: usize>(w: &[W], kb: usize, a: &[ActQ8], one: fn(&[W], &[ActQ8]) -> f32, cols: ColsN<W, C>) {
        let col = |c: usize| &w[c * kb..(c + 1) * kb];
        let got = cols(std::array::from_fn(col), a).map(f32::to_bits);
        let want: [u32; C] = std::array::from_fn(|c| one(col(c), a).to_bits());
        assert_eq!(got, want);
    }

    /// Several columns at once compute exactly what one column at a time computes.
    #[test]
    fn column_kernels_equal_single_kernels_bit_for_bit() {
        let (k, n) = (256, 4);
        let kb = k / QK;
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0).collect();
        let (a1, a0) = (quantize_q8_1(&x), quantize_q8_0(&x));
        let w41 = dot::parse_q4_1(&bytes(n * kb, 20, 1));
        let w80 = dot::parse_q8_0(&bytes(n * kb, 34, 2));
        let w50 = dot::parse_q5_0(&bytes(n * kb, 22, 3));
        check::<_, 2>(&w41, kb, &a1, dot::q4_1_q8_1, q4_1_q8_1::<2>);
        check::<_, 4>(&w41, kb, &a1, dot::q4_1_q8_1, q4_1_q8_1::<4>);
        check::<_, 2>(&w80, kb, &a0, dot::q8_0_q8_0, q8_0_q8_0::<2>);
        check::<_, 4>(&w80, kb, &a0, dot::q8_0_q8_0, q8_0_q8_0::<4>);
        check::<_, 2>(&w50, kb, &a0, dot::q5_0_q8_0, q5_0_q8_0::<2>);
        check::<_, 4>(&w50, kb, &a0, dot::q5_0_q8_0, q5_0_q8_0::<4>);
    }

    #[test]
    #[ignore = "micro-benchmark: DOT_N=200000 cargo test --release -p corral-engine cols_speed -- --ignored --nocapture"]
    fn cols_speed() {
        use std::time::Instant;
        let k = 576;
        let kb = k / QK;
        let n: usize = std::env::var("DOT_N").map(|v| v.parse().expect("DOT_N")).unwrap_or(1536);
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0).collect();
        let (a1, a0) = (quantize_q8_1(&x), quantize_q8_0(&x));
        let w41 = dot::parse_q4_1(&bytes(n * kb, 20, 1));
        let w80 = dot::parse_q8_0(&bytes(n * kb, 34, 2));
        let reps = 200 * 1536 / n + 2;
        fn time<W>(name: &str, reps: usize, n: usize, kb: usize, mut f: impl FnMut(usize) -> f32) {
            let t = Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps {
                let mut c = 0;
                while c < n {
                    sink += f(c);
                    c += 4;
                }
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * n * kb) as f64;
            eprintln!("{name}: {ns:.2} ns/block ({sink}, {})", std::any::type_name::<W>().len());
        }
        let col41 = |c: usize| &w41[c * kb..(c + 1) * kb];
        let col80 = |c: usize| &w80[c * kb..(c + 1) * kb];
        time::<BlockQ4_1>("q4_1 x1", reps, n, kb, |c| (0..4).map(|j| dot::q4_1_q8_1(col41(c + j), &a1)).sum());
        time::<BlockQ4_1>("q4_1 x2", reps, n, kb, |c| {
            q4_1_q8_1::<2>([col41(c), col41(c + 1)], &a1).iter().sum::<f32>()
                + q4_1_q8_1::<2>([col41(c + 2), col41(c + 3)], &a1).iter().sum::<f32>()
        });
        time::<BlockQ4_1>("q4_1 x4", reps, n, kb, |c| {
            q4_1_q8_1::<4>(std::array::from_fn(|j| col41(c + j)), &a1).iter().sum()
        });
        time::<BlockQ8_0>("q8_0 x1", reps, n, kb, |c| (0..4).map(|j| dot::q8_0_q8_0(col80(c + j), &a0)).sum());
        time::<BlockQ8_0>("q8_0 x2", reps, n, kb, |c| {
            q8_0_q8_0::<2>([col80(c), col80(c + 1)], &a0).iter().sum::<f32>()
                + q8_0_q8_0::<2>([col80(c + 2), col80(c + 3)], &a0).iter().sum::<f32>()
        });
        time::<BlockQ8_0>("q8_0 x4", reps, n, kb, |c| {
            q8_0_q8_0::<4>(std::array::from_fn(|j| col80(c + j)), &a0).iter().sum()
        });
    }
}
