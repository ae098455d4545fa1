//! Weight blocks as stored in GGUF and their dot products with quantized activations,
//! in ggml's AVX2 order: per block, eight i32 lanes each summing four consecutive
//! products; `acc[lane] = fma(d_w * d_a, lane_sum, acc[lane])`; then
//! `((a4+a0)+(a6+a2)) + ((a5+a1)+(a7+a3))`.

use half::f16;

use super::act::{ActQ8, QK};
use super::cols::{self, ColsN};
use super::isa;
use super::simd;
use super::stream::{collect_weights, prefetch};

/// Q4_1: 32 4-bit values `q`, weight = d * q + m. Low nibbles are elements 0..16.
/// Scales stay f16 as in the file (decode streams every weight once per token).
#[derive(Clone, Copy)]
pub(crate) struct BlockQ4_1 {
    pub(super) d: f16,
    pub(super) m: f16,
    pub(super) qs: [u8; QK / 2],
}

/// Q5_0: 32 5-bit values, weight = d * (q - 16), held here as the signed result.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ5_0 {
    pub(super) d: f32,
    pub(super) qs: [i8; QK],
}

pub(crate) fn parse_q5_0(bytes: &[u8]) -> Vec<BlockQ5_0> {
    collect_weights(bytes.chunks_exact(2 + 4 + QK / 2).map(|b| {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let nib = &b[6..];
        let mut qs = [0i8; QK];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = if j < QK / 2 { nib[j] & 0xf } else { nib[j - QK / 2] >> 4 };
            let hi = ((qh >> j) & 1) as u8;
            *q = (lo | (hi << 4)) as i8 - 16;
        }
        BlockQ5_0 { d: f16_at(b, 0), qs }
    }))
}

pub(crate) fn q5_0_q8_0(w: &[BlockQ5_0], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        fma_lanes(&mut acc, wb.d * ab.d, simd::i8_i8(&wb.qs, &ab.qs));
    }
    hsum8(&acc)
}

/// Q8_0: 32 signed bytes, weight = d * q.
#[derive(Clone, Copy)]
pub(crate) struct BlockQ8_0 {
    pub(super) d: f16,
    pub(super) qs: [i8; QK],
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half_at(b, i).to_f32()
}

fn half_at(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

pub(crate) fn parse_q4_1(bytes: &[u8]) -> Vec<BlockQ4_1> {
    collect_weights(bytes.chunks_exact(4 + QK / 2).map(|b| {
        let mut qs = [0u8; QK / 2];
        qs.copy_from_slice(&b[4..]);
        BlockQ4_1 { d: half_at(b, 0), m: half_at(b, 2), qs }
    }))
}

pub(crate) fn parse_q8_0(bytes: &[u8]) -> Vec<BlockQ8_0> {
    collect_weights(bytes.chunks_exact(2 + QK).map(|b| {
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(&b[2..]) {
            *q = v as i8;
        }
        BlockQ8_0 { d: half_at(b, 0), qs }
    }))
}

#[inline]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))
}

/// `acc[l] = fma(d, lanes[l], acc[l])` for the eight lanes (one vector FMA).
#[inline]
pub(crate) fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for l in 0..8 {
        acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
    }
}

pub(crate) fn q4_1_q8_1(w: &[BlockQ4_1], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        summs = wb.m.to_f32().mul_add(ab.s, summs);
        fma_lanes(&mut acc, wb.d.to_f32() * ab.d, simd::nib4_i8(&wb.qs, &ab.qs));
    }
    hsum8(&acc) + summs
}

pub(crate) fn q8_0_q8_0(w: &[BlockQ8_0], a: &[ActQ8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, ab) in w.iter().zip(a) {
        prefetch(wb);
        fma_lanes(&mut acc, wb.d.to_f32() * ab.d, simd::i8_i8(&wb.qs, &ab.qs));
    }
    hsum8(&acc)
}

/// One weight row against `N` activation rows (`w·a[r]`), each with exactly the
/// arithmetic of the one-at-a-time kernel: the weight block is unpacked once for all of
/// them, and their FMA chains overlap.
pub(crate) type DotN<W, const N: usize> = fn(&[W], [&[ActQ8]; N]) -> [f32; N];

/// One kernel in every shape: one row against one column, two to four rows against one
/// column (prefill, batches), one row against four columns (decode, `super::cols`).
pub(crate) struct Dots<W> {
    pub one: fn(&[W], &[ActQ8]) -> f32,
    pub cols4: ColsN<W, 4>,
    pub x2: DotN<W, 2>,
    pub x3: DotN<W, 3>,
    pub x4: DotN<W, 4>,
}

/// The VNNI form of a grouped kernel where the CPU has it (`super::isa`), else AVX2.
fn pick<T>(avx2: T, vnni: T) -> T {
    if isa::vnni() { vnni } else { avx2 }
}

pub(crate) fn dots_q4_1() -> Dots<BlockQ4_1> {
    Dots {
        one: q4_1_q8_1,
        cols4: cols::q4_1_q8_1::<4>,
        x2: pick(xn::q4_1_q8_1::<2>, xn::q4_1_q8_1_vnni::<2>),
        x3: pick(xn::q4_1_q8_1::<3>, xn::q4_1_q8_1_vnni::<3>),
        x4: pick(xn::q4_1_q8_1::<4>, xn::q4_1_q8_1_vnni::<4>),
    }
}

pub(crate) fn dots_q5_0() -> Dots<BlockQ5_0> {
    Dots {
        one: q5_0_q8_0,
        cols4: cols::q5_0_q8_0::<4>,
        x2: pick(xn::q5_0_q8_0::<2>, xn::q5_0_q8_0_vnni::<2>),
        x3: pick(xn::q5_0_q8_0::<3>, xn::q5_0_q8_0_vnni::<3>),
        x4: pick(xn::q5_0_q8_0::<4>, xn::q5_0_q8_0_vnni::<4>),
    }
}

pub(crate) fn dots_q8_0() -> Dots<BlockQ8_0> {
    Dots {
        one: q8_0_q8_0,
        cols4: cols::q8_0_q8_0::<4>,
        x2: pick(xn::q8_0_q8_0::<2>, xn::q8_0_q8_0_vnni::<2>),
        x3: pick(xn::q8_0_q8_0::<3>, xn::q8_0_q8_0_vnni::<3>),
        x4: pick(xn::q8_0_q8_0::<4>, xn::q8_0_q8_0_vnni::<4>),
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(super) mod xn {
    use std::arch::x86_64::*;

    use super::isa::{Avx2, Isa, Vnni};
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, BlockQ8_0, hsum8, prefetch};

    // SAFETY (every block here): AVX2 and FMA are target features of this build; loads
    // read exactly the 16 or 32 bytes of the fixed-size arrays they are given, stores
    // write an [f32; 8].

    /// Each accumulator's eight lanes in `hsum8`'s order, plus `extra`; two to eight of
    /// them summed side by side (`lanes::hsum8_each`: the same additions, bit for bit).
    #[inline]
    pub(in super::super) fn finish<const N: usize>(acc: [__m256; N], extra: [f32; N]) -> [f32; N] {
        if (2..=8).contains(&N) {
            let mut sums = [0.0f32; 8];
            unsafe {
                let t = std::array::from_fn(|r| acc.get(r).copied().unwrap_or(_mm256_setzero_ps()));
                let e: [f32; 8] = std::array::from_fn(|r| extra.get(r).copied().unwrap_or(0.0));
                let s = _mm256_add_ps(crate::kernels::lanes::hsum8_each(t), _mm256_loadu_ps(e.as_ptr()));
                _mm256_storeu_ps(sums.as_mut_ptr(), s);
            }
            return std::array::from_fn(|r| sums[r]);
        }
        std::array::from_fn(|r| {
            let mut l = [0.0f32; 8];
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[r]) };
            hsum8(&l) + extra[r]
        })
    }

    /// `acc = fma(d, float(lanes of x·y), acc)` with `x` unsigned bytes < 128.
    #[inline(always)]
    pub(in super::super) unsafe fn step(acc: __m256, d: f32, x: __m256i, y: __m256i) -> __m256 {
        unsafe { step_v::<Avx2>(acc, _mm256_set1_ps(d), x, y) }
    }

    /// `step` with the scale already in every lane, the integer lanes formed by `I`.
    #[inline(always)]
    unsafe fn step_v<I: Isa>(acc: __m256, d: __m256, x: __m256i, y: __m256i) -> __m256 {
        unsafe { _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(I::dot4(x, y)), acc) }
    }

    /// `d_w * d_a` in every lane, from the weight scale already in every lane and the
    /// activation scale read straight into every lane (the same product as the scalar one).
    #[inline(always)]
    unsafe fn scale(dw: __m256, da: &f32) -> __m256 {
        unsafe { _mm256_mul_ps(dw, _mm256_broadcast_ss(da)) }
    }

    fn blocks<W, const N: usize>(w: &[W], a: &[&[ActQ8]; N]) -> usize {
        a.iter().map(|a| a.len()).fold(w.len(), usize::min)
    }

    /// A grouped kernel's entry points: the AVX2 form, and the VNNI form compiled with
    /// those instructions enabled, taken only where `isa::vnni()` holds (`super::pick`).
    macro_rules! entries {
        ($W:ty, $body:ident, $avx2:ident, $vnni:ident, $enabled:ident) => {
            pub(crate) fn $avx2<const N: usize>(w: &[$W], a: [&[ActQ8]; N]) -> [f32; N] {
                $body::<Avx2, N>(w, a)
            }

            #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
            unsafe fn $enabled<const N: usize>(w: &[$W], a: [&[ActQ8]; N]) -> [f32; N] {
                $body::<Vnni, N>(w, a)
            }

            pub(crate) fn $vnni<const N: usize>(w: &[$W], a: [&[ActQ8]; N]) -> [f32; N] {
                // SAFETY: `pick` hands this out only where the CPU has AVX-512 VNNI + VL.
                unsafe { $enabled::<N>(w, a) }
            }
        };
    }

    entries!(BlockQ4_1, q4_1_rows, q4_1_q8_1, q4_1_q8_1_vnni, q4_1_q8_1_enabled);
    entries!(BlockQ8_0, q8_0_rows, q8_0_q8_0, q8_0_q8_0_vnni, q8_0_q8_0_enabled);
    entries!(BlockQ5_0, q5_0_rows, q5_0_q8_0, q5_0_q8_0_vnni, q5_0_q8_0_enabled);

    #[inline(always)]
    fn q4_1_rows<I: Isa, const N: usize>(w: &[BlockQ4_1], a: [&[ActQ8]; N]) -> [f32; N] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; N];
        let mut summs = [0.0f32; N];
        for (b, wb) in w[..blocks(w, &a)].iter().enumerate() {
            prefetch(wb);
            let m = wb.m.to_f32();
            unsafe {
                let d = _mm256_set1_ps(wb.d.to_f32());
                let lo = _mm_loadu_si128(wb.qs.as_ptr().cast());
                let x = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(lo, 4), lo), _mm256_set1_epi8(0x0f));
                for r in 0..N {
                    let ab = &a[r][b];
                    summs[r] = m.mul_add(ab.s, summs[r]);
                    acc[r] = step_v::<I>(acc[r], scale(d, &ab.d), x, _mm256_loadu_si256(ab.qs.as_ptr().cast()));
                }
            }
        }
        finish(acc, summs)
    }

    /// Signed weights `qs` with scale `d` against the rows' block `b`.
    #[inline(always)]
    fn signed<I: Isa, const N: usize>(qs: &[i8; 32], d: f32, a: &[&[ActQ8]; N], b: usize, acc: &mut [__m256; N]) {
        unsafe {
            let x = _mm256_loadu_si256(qs.as_ptr().cast());
            let (ax, d) = (_mm256_sign_epi8(x, x), _mm256_set1_ps(d));
            for r in 0..N {
                let ab = &a[r][b];
                let y = _mm256_loadu_si256(ab.qs.as_ptr().cast());
                acc[r] = step_v::<I>(acc[r], scale(d, &ab.d), ax, _mm256_sign_epi8(y, x));
            }
        }
    }

    #[inline(always)]
    fn q8_0_rows<I: Isa, const N: usize>(w: &[BlockQ8_0], a: [&[ActQ8]; N]) -> [f32; N] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; N];
        for (b, wb) in w[..blocks(w, &a)].iter().enumerate() {
            prefetch(wb);
            signed::<I, N>(&wb.qs, wb.d.to_f32(), &a, b, &mut acc);
        }
        finish(acc, [0.0; N])
    }

    #[inline(always)]
    fn q5_0_rows<I: Isa, const N: usize>(w: &[BlockQ5_0], a: [&[ActQ8]; N]) -> [f32; N] {
        let mut acc = [unsafe { _mm256_setzero_ps() }; N];
        for (b, wb) in w[..blocks(w, &a)].iter().enumerate() {
            prefetch(wb);
            signed::<I, N>(&wb.qs, wb.d, &a, b, &mut acc);
        }
        finish(acc, [0.0; N])
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
mod xn {
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, BlockQ8_0};

    pub(crate) fn q4_1_q8_1<const N: usize>(w: &[BlockQ4_1], a: [&[ActQ8]; N]) -> [f32; N] {
        a.map(|a| super::q4_1_q8_1(w, a))
    }
    pub(crate) fn q8_0_q8_0<const N: usize>(w: &[BlockQ8_0], a: [&[ActQ8]; N]) -> [f32; N] {
        a.map(|a| super::q8_0_q8_0(w, a))
    }
    pub(crate) fn q5_0_q8_0<const N: usize>(w: &[BlockQ5_0], a: [&[ActQ8]; N]) -> [f32; N] {
        a.map(|a| super::q5_0_q8_0(w, a))
    }
    pub(crate) use {q4_1_q8_1 as q4_1_q8_1_vnni, q5_0_q8_0 as q5_0_q8_0_vnni, q8_0_q8_0 as q8_0_q8_0_vnni};
}

#[cfg(test)]
mod tests {
    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine dot_speed -- --ignored --nocapture"]
    fn dot_speed() {
        use std::time::Instant;
        let k = 576;
        let n = 1536;
        let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0).collect();
        let bytes: Vec<u8> = (0..n * k / QK * 20).map(|i| (i * 31 % 251) as u8 & 0x3f).collect();
        let w = parse_q4_1(&bytes);
        let a = quantize_q8_1(&x);
        let kb = k / QK;
        let t = Instant::now();
        let mut sink = 0.0;
        let reps = 200;
        for _ in 0..reps {
            for c in 0..n {
                sink += q4_1_q8_1(&w[c * kb..(c + 1) * kb], &a);
            }
        }
        let dt = t.elapsed().as_secs_f64();
        let blocks = (reps * n * kb) as f64;
        eprintln!("q4_1: {:.2} ns/block ({sink})", dt * 1e9 / blocks);
    }

    use super::super::act::{quantize_q8_0, quantize_q8_1};
    use super::*;

    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine xn_speed -- --ignored --nocapture"]
    fn xn_speed() {
        use std::time::Instant;
        let (k, n, reps) = (1024, 512, 40);
        let xs: Vec<Vec<f32>> =
            (0..4).map(|r| (0..k).map(|i| (((i * 37 + r * 11) % 19) as f32 - 9.0) / 7.0).collect()).collect();
        let a1: Vec<Vec<ActQ8>> = xs.iter().map(|x| quantize_q8_1(x)).collect();
        let a0: Vec<Vec<ActQ8>> = xs.iter().map(|x| quantize_q8_0(x)).collect();
        let kb = k / QK;
        let bytes = |per: usize| -> Vec<u8> { (0..n * kb * per).map(|i| (i * 31 % 251) as u8 & 0x3b).collect() };
        let (w41, w50, w80) = (parse_q4_1(&bytes(20)), parse_q5_0(&bytes(22)), parse_q8_0(&bytes(34)));
        fn time<W>(name: &str, w: &[W], a: &[Vec<ActQ8>], x4: DotN<W, 4>, kb: usize, n: usize, reps: usize) {
            let rows = [&a[0][..], &a[1][..], &a[2][..], &a[3][..]];
            let t = Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps {
                for c in 0..n {
                    sink += x4(&w[c * kb..][..kb], rows).iter().sum::<f32>();
                }
            }
            let per = t.elapsed().as_secs_f64() * 1e9 / (reps * n * kb * 4) as f64;
            eprintln!("{name} x4: {per:.3} ns per block and row ({sink})");
        }
        time("q4_1", &w41, &a1, dots_q4_1().x4, kb, n, reps);
        time("q5_0", &w50, &a0, dots_q5_0().x4, kb, n, reps);
        time("q8_0", &w80, &a0, dots_q8_0().x4, kb, n, reps);
    }

    /// The grouped kernels compute exactly what the single ones compute, for every group size.
    #[test]
    fn grouped_kernels_equal_single_kernels_bit_for_bit() {
        let k = 256;
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|r| (0..k).map(|i| (((i * 37 + r * 11) % 19) as f32 - 9.0) / (7.0 + r as f32)).collect())
            .collect();
        let a1: Vec<Vec<ActQ8>> = xs.iter().map(|x| quantize_q8_1(x)).collect();
        let a0: Vec<Vec<ActQ8>> = xs.iter().map(|x| quantize_q8_0(x)).collect();
        let bytes = |per: usize, r: usize| -> Vec<u8> {
            (0..k / QK * per).map(|i| ((i * 31 + r * 97) % 251) as u8 & if i % per < 4 { 0x3b } else { 0xff }).collect()
        };
        let w41 = parse_q4_1(&bytes(20, 1));
        let w80 = parse_q8_0(&bytes(34, 2));
        let w50 = parse_q5_0(&bytes(22, 3));
        fn check<W>(w: &[W], a: &[Vec<ActQ8>], dots: Dots<W>) {
            let want: Vec<u32> = a.iter().map(|a| (dots.one)(w, a).to_bits()).collect();
            eprintln!("grouped kernels: {}", isa::describe());
            let got2 = (dots.x2)(w, std::array::from_fn(|r| a[r].as_slice())).map(f32::to_bits);
            let got3 = (dots.x3)(w, std::array::from_fn(|r| a[r].as_slice())).map(f32::to_bits);
            let got4 = (dots.x4)(w, std::array::from_fn(|r| a[r].as_slice())).map(f32::to_bits);
            assert_eq!(got2[..], want[..2]);
            assert_eq!(got3[..], want[..3]);
            assert_eq!(got4[..], want[..4]);
        }
        check(&w41, &a1, dots_q4_1());
        check(&w80, &a0, dots_q8_0());
        check(&w50, &a0, dots_q5_0());
        // The AVX2 forms too, where `pick` chose the VNNI ones.
        let avx2 =
            |d: Dots<BlockQ4_1>| Dots { x2: xn::q4_1_q8_1::<2>, x3: xn::q4_1_q8_1::<3>, x4: xn::q4_1_q8_1::<4>, ..d };
        check(&w41, &a1, avx2(dots_q4_1()));
        let avx2 =
            |d: Dots<BlockQ8_0>| Dots { x2: xn::q8_0_q8_0::<2>, x3: xn::q8_0_q8_0::<3>, x4: xn::q8_0_q8_0::<4>, ..d };
        check(&w80, &a0, avx2(dots_q8_0()));
        let avx2 =
            |d: Dots<BlockQ5_0>| Dots { x2: xn::q5_0_q8_0::<2>, x3: xn::q5_0_q8_0::<3>, x4: xn::q5_0_q8_0::<4>, ..d };
        check(&w50, &a0, avx2(dots_q5_0()));
    }

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
