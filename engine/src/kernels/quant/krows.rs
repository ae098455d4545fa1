//! Q4_K and Q6_K weights against one to four activation rows at once (prefill and
//! batches). Each row's arithmetic is exactly the one-row kernel's in `super::kquants`
//! (Q4_K's gemv order, Q6_K's `vec_dot` order): the integer sums are exact in any
//! order, so they are formed here with `maddubs` and a `madd` by the sub-block scale,
//! and only the float steps — which are the same instructions on the same values —
//! decide the bits. What the grouping buys is that each weight super-block is read and
//! its scales prepared once for all the rows, and the rows' chains overlap.
//!
//! The weights arrive packed as GGUF stores them (`super::kquants`) and are unpacked here
//! 32 values at a time, in registers, as ggml's AVX2 `vec_dot` kernels do: Q4_K's low
//! nibbles by a mask, its high ones by a 16-bit shift and the mask; Q6_K's two high bits
//! shifted up to bits 4..6 and or-ed onto the four low ones. The unpacked bytes are the
//! values a byte-per-value layout would hold, so every sum is unchanged.

use super::act::ActQ8K;
use super::kquants::{BlockQ4K, BlockQ6K};

/// One weight row (`[k_blocks]` super-blocks) against `N` activation rows.
pub(crate) type KRows<W, const N: usize> = fn(&[W], [&[ActQ8K]; N]) -> [f32; N];

/// A K-quant kernel in the shapes the matmul driver uses (see `super::dot::Dots`).
pub(crate) struct KDots<W> {
    pub x1: KRows<W, 1>,
    pub x2: KRows<W, 2>,
    pub x3: KRows<W, 3>,
    pub x4: KRows<W, 4>,
}

pub(crate) fn dots_q4_k() -> KDots<BlockQ4K> {
    KDots { x1: imp::q4_k::<1>, x2: imp::q4_k::<2>, x3: imp::q4_k::<3>, x4: imp::q4_k::<4> }
}

pub(crate) fn dots_q6_k() -> KDots<BlockQ6K> {
    KDots { x1: imp::q6_k::<1>, x2: imp::q6_k::<2>, x3: imp::q6_k::<3>, x4: imp::q6_k::<4> }
}

/// Shared with the tiles (`super::ktile`).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(super) use imp::{at, bsums16, nibbles, six_bits};

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod imp {
    use std::arch::x86_64::*;

    use super::super::act::ActQ8K;
    use super::super::dot::xn::finish;
    use super::super::kquants::{BlockQ4K, BlockQ6K};
    use super::super::stream::prefetch;

    // SAFETY (every block here): AVX2 and FMA are target features of this build; each
    // load reads 16 or 32 bytes inside the fixed-size array it is given (`at` bounds
    // the offset), stores write a fixed-size array of the same width.

    /// The 32 bytes at `i` of a byte array, as a vector.
    #[inline(always)]
    pub(in super::super) fn at<T, const L: usize>(v: &[T; L], i: usize) -> __m256i {
        let s: &[T; 32] = v[i..i + 32].try_into().expect("in bounds");
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// Q4_K sub-block `sb`, one value a byte: the low (even `sb`) or high (odd) nibbles
    /// of bytes `32(sb / 2)..`.
    #[inline(always)]
    pub(in super::super) fn nibbles(wb: &BlockQ4K, sb: usize) -> __m256i {
        let bits = at(&wb.qs, sb / 2 * 32);
        unsafe {
            let bits = if sb.is_multiple_of(2) { bits } else { _mm256_srli_epi16::<4>(bits) };
            _mm256_and_si256(bits, _mm256_set1_epi8(0x0f))
        }
    }

    /// Q6_K group `g = 4h + c` (values `32g..32g + 32`), one value a byte: nibble `c / 2`
    /// of `ql[64h + 32(c % 2)..]`, with bits `2c..2c + 2` of `qh[32h..]` as its bits 4
    /// and 5. (The 16-bit shifts carry bits across bytes only into places the masks
    /// clear.) Formed one group at a time: four at once spill registers in the 4-row kernel.
    #[inline(always)]
    pub(in super::super) fn six_bits(wb: &BlockQ6K, g: usize) -> __m256i {
        let (h, c) = (g / 4, g % 4);
        let (ql, qh) = (at(&wb.ql, 64 * h + 32 * (c % 2)), at(&wb.qh, 32 * h));
        unsafe {
            let (ql, qh) = match c {
                0 => (ql, _mm256_slli_epi16::<4>(qh)),
                1 => (ql, _mm256_slli_epi16::<2>(qh)),
                2 => (_mm256_srli_epi16::<4>(ql), qh),
                _ => (_mm256_srli_epi16::<4>(ql), _mm256_srli_epi16::<2>(qh)),
            };
            _mm256_or_si256(_mm256_and_si256(ql, _mm256_set1_epi8(0x0f)), _mm256_and_si256(qh, _mm256_set1_epi8(0x30)))
        }
    }

    fn blocks<W, const N: usize>(w: &[W], a: &[&[ActQ8K]; N]) -> usize {
        a.iter().map(|a| a.len()).fold(w.len(), usize::min)
    }

    /// The sums of the eight i32 lanes of `x` and of `y` (exact: no overflow at these
    /// magnitudes).
    #[inline(always)]
    unsafe fn hsum_pair(x: __m256i, y: __m256i) -> (i32, i32) {
        unsafe {
            let h = _mm256_hadd_epi32(x, y);
            let q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let s = _mm_hadd_epi32(q, q);
            (_mm_cvtsi128_si32(s), _mm_extract_epi32::<1>(s))
        }
    }

    /// A Q8_K row's sixteen sums of 16 as i16 lanes, in order (they fit: |sum| <= 2048).
    #[inline(always)]
    pub(in super::super) unsafe fn bsums16(bsums: &[i32; 16]) -> __m256i {
        unsafe {
            let p = bsums.as_ptr().cast::<__m256i>();
            // `packs` interleaves the two inputs by 128-bit lane; the permute restores order.
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(
                _mm256_loadu_si256(p),
                _mm256_loadu_si256(p.add(1)),
            ))
        }
    }

    /// The sums of the eight i32 lanes of each of `a`, `b`, `c` and `d`, as lanes 0..4
    /// (exact, as `hsum_pair`).
    #[inline(always)]
    unsafe fn hsum4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
        unsafe {
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
            _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
        }
    }

    pub(super) fn q4_k<const N: usize>(w: &[BlockQ4K], a: [&[ActQ8K]; N]) -> [f32; N] {
        let (mut acc, mut acc_min) = ([0.0f32; N], [0.0f32; N]);
        let (mut acc4, mut acc_min4) = unsafe { (_mm_setzero_ps(), _mm_setzero_ps()) };
        for (b, wb) in w[..blocks(w, &a)].iter().enumerate() {
            prefetch(wb);
            let mut lanes = [unsafe { _mm256_setzero_si256() }; N];
            for sb in 0..8 {
                unsafe {
                    let x = nibbles(wb, sb);
                    let sc = _mm256_set1_epi16(wb.scales[sb] as i16);
                    for r in 0..N {
                        let p = _mm256_maddubs_epi16(x, at(&a[r][b].qs, sb * 32));
                        lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(p, sc));
                    }
                }
            }
            // Each min twice, so that a `madd` with the sums of 16 gives min * sum of 32.
            let mins = unsafe {
                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                    _mm_loadl_epi64(wb.mins.as_ptr().cast()),
                    _mm_loadl_epi64(wb.mins.as_ptr().cast()),
                ))
            };
            if N == 4 {
                // Four rows at once: the same sums (exact) and the same float steps, lane
                // by lane, as the per-row tail below.
                unsafe {
                    let m: [__m256i; 4] = std::array::from_fn(|r| _mm256_madd_epi16(bsums16(&a[r][b].bsums), mins));
                    let isum = hsum4(lanes[0], lanes[1], lanes[2], lanes[3]);
                    let imin = hsum4(m[0], m[1], m[2], m[3]);
                    let ad = _mm_set_ps(a[3][b].d, a[2][b].d, a[1][b].d, a[0][b].d);
                    let (d, dmin) = (_mm_mul_ps(_mm_set1_ps(wb.d), ad), _mm_mul_ps(_mm_set1_ps(wb.dmin), ad));
                    acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), d, acc4);
                    acc_min4 = _mm_fmadd_ps(_mm_cvtepi32_ps(imin), dmin, acc_min4);
                }
                continue;
            }
            for r in 0..N {
                let ab = &a[r][b];
                let (isum, imin) = unsafe { hsum_pair(lanes[r], _mm256_madd_epi16(bsums16(&ab.bsums), mins)) };
                acc[r] = (isum as f32).mul_add(wb.d * ab.d, acc[r]);
                acc_min[r] = (imin as f32).mul_add(wb.dmin * ab.d, acc_min[r]);
            }
        }
        if N == 4 {
            let mut out = [0.0f32; 4];
            unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_sub_ps(acc4, acc_min4)) };
            return std::array::from_fn(|r| out[r]);
        }
        std::array::from_fn(|r| acc[r] - acc_min[r])
    }

    pub(super) fn q6_k<const N: usize>(w: &[BlockQ6K], a: [&[ActQ8K]; N]) -> [f32; N] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; N];
        for (b, wb) in w[..blocks(w, &a)].iter().enumerate() {
            prefetch(wb);
            let mut lanes = [unsafe { _mm256_setzero_si256() }; N];
            unsafe {
                for g in 0..8 {
                    // Lanes 0..4 take scale 2g, lanes 4..8 scale 2g + 1.
                    let lo = _mm_set1_epi16(wb.scales[2 * g] as i16);
                    let sc = _mm256_set_m128i(_mm_set1_epi16(wb.scales[2 * g + 1] as i16), lo);
                    let x = six_bits(wb, g);
                    for r in 0..N {
                        let p = _mm256_maddubs_epi16(x, at(&a[r][b].qs, g * 32));
                        lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(p, sc));
                    }
                }
                // Lane l loses 32 * (bsums[2l] * scales[2l] + bsums[2l+1] * scales[2l+1]).
                let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.scales.as_ptr().cast()));
                for r in 0..N {
                    let ab = &a[r][b];
                    let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums16(&ab.bsums), scales));
                    let d = _mm256_set1_ps(ab.d * wb.d);
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(lanes[r], offset)), acc[r]);
                }
            }
        }
        finish(acc, [0.0; N])
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
mod imp {
    use super::super::act::ActQ8K;
    use super::super::kquants::{self, BlockQ4K, BlockQ6K, Q4KPath};

    pub(super) fn q4_k<const N: usize>(w: &[BlockQ4K], a: [&[ActQ8K]; N]) -> [f32; N] {
        a.map(|a| kquants::q4_k_q8_k(w, a, Q4KPath::Gemv))
    }

    pub(super) fn q6_k<const N: usize>(w: &[BlockQ6K], a: [&[ActQ8K]; N]) -> [f32; N] {
        a.map(|a| kquants::q6_k_q8_k(w, a))
    }
}

#[cfg(test)]
mod tests {
    use super::super::act::{Q8KSign, QK_K, quantize_q8_k};
    use super::super::kquants::{self, Q4KPath, parse_q4_k, parse_q6_k};
    use super::*;

    /// Deterministic bytes with every bit pattern in play (scales, mins, high bits).
    fn bytes(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8).collect()
    }

    fn acts(rows: usize, k: usize) -> Vec<Vec<ActQ8K>> {
        (0..rows)
            .map(|r| {
                let x: Vec<f32> =
                    (0..k).map(|i| (((i * 37 + r * 11) % 251) as f32 - 125.0) / (3.0 + r as f32)).collect();
                quantize_q8_k(&x, Q8KSign::FirstMax)
            })
            .collect()
    }

    /// Fix the f16 scales to ordinary values (random bytes may spell NaN or infinity).
    fn with_scales(mut b: Vec<u8>, per: usize, at: &[usize]) -> Vec<u8> {
        for blk in b.chunks_exact_mut(per) {
            for &i in at {
                let v = half::f16::from_f32(0.01 + blk[i] as f32 / 4096.0);
                blk[i..i + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    fn check<W>(w: &[W], a: &[Vec<ActQ8K>], one: impl Fn(&[W], &[ActQ8K]) -> f32, dots: KDots<W>) {
        let want: Vec<u32> = a.iter().map(|a| one(w, a).to_bits()).collect();
        let rows = |n: usize| -> Vec<u32> {
            let got: Vec<f32> = match n {
                1 => (dots.x1)(w, [&a[0]]).to_vec(),
                2 => (dots.x2)(w, [&a[0], &a[1]]).to_vec(),
                3 => (dots.x3)(w, [&a[0], &a[1], &a[2]]).to_vec(),
                _ => (dots.x4)(w, [&a[0], &a[1], &a[2], &a[3]]).to_vec(),
            };
            got.into_iter().map(f32::to_bits).collect()
        };
        for n in 1..=4 {
            assert_eq!(rows(n)[..], want[..n], "{n} rows");
        }
    }

    #[test]
    fn grouped_k_quants_equal_the_one_row_kernels_bit_for_bit() {
        let k = 4 * QK_K;
        let a = acts(4, k);
        let q4 = parse_q4_k(&with_scales(bytes(4 * 144, 1), 144, &[0, 2]));
        check(&q4, &a, |w, a| kquants::q4_k_q8_k(w, a, Q4KPath::Gemv), dots_q4_k());
        let q6 = parse_q6_k(&with_scales(bytes(4 * 210, 2), 210, &[208]));
        check(&q6, &a, kquants::q6_k_q8_k, dots_q6_k());
    }

    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine krows_speed -- --ignored --nocapture"]
    fn krows_speed() {
        use std::time::Instant;
        let (k, n, reps) = (1024, 512, 20);
        let a = acts(4, k);
        let q4 = parse_q4_k(&with_scales(bytes(n * k / QK_K * 144, 1), 144, &[0, 2]));
        let q6 = parse_q6_k(&with_scales(bytes(n * k / QK_K * 210, 2), 210, &[208]));
        let kb = k / QK_K;
        let time = |name: &str, f: &dyn Fn(usize) -> f32| {
            let t = Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps {
                for c in 0..n {
                    sink += f(c);
                }
            }
            let per = t.elapsed().as_secs_f64() * 1e9 / (reps * n * kb * 4) as f64;
            eprintln!("{name}: {per:.2} ns per super-block and row ({sink})");
        };
        let rows = [&a[0][..], &a[1][..], &a[2][..], &a[3][..]];
        time("q4_k one row", &|c| rows.iter().map(|r| kquants::q4_k_q8_k(&q4[c * kb..][..kb], r, Q4KPath::Gemv)).sum());
        time("q4_k x1", &|c| rows.iter().map(|&r| (dots_q4_k().x1)(&q4[c * kb..][..kb], [r])[0]).sum());
        time("q4_k x4", &|c| (dots_q4_k().x4)(&q4[c * kb..][..kb], rows).iter().sum());
        time("q6_k one row", &|c| rows.iter().map(|r| kquants::q6_k_q8_k(&q6[c * kb..][..kb], r)).sum());
        time("q6_k x1", &|c| rows.iter().map(|&r| (dots_q6_k().x1)(&q6[c * kb..][..kb], [r])[0]).sum());
        time("q6_k x4", &|c| (dots_q6_k().x4)(&q6[c * kb..][..kb], rows).iter().sum());
    }
}
