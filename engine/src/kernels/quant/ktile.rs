//! Two Q4_K or Q6_K weight columns against four activation rows per call (prefill and
//! batches, on CPUs with AVX-512 VNNI): a register tile of eight (row, column) dots.
//! Each dot keeps exactly the one-row arithmetic of `super::krows` (Q4_K's gemv order,
//! Q6_K's `vec_dot` order): the integer sums are exact in any order, and the float steps
//! are the same operations on the same values, lane by lane. What the tile changes is
//! how many instructions form those values:
//! - an activation sub-block is loaded once for both columns, a weight sub-block once
//!   for all four rows;
//! - the sub-block scale multiply and the add are one `vpdpwssd` after the `maddubs`,
//!   the scale brought into every lane by one byte shuffle;
//! - Q4_K's per-block horizontal sums (eight of them for the lanes, eight for the
//!   mins) are two transposing reductions, and its two float chains run for all eight
//!   dots in one vector each;
//! - the packed weights (`super::kquants`) are unpacked once per tile for all four rows,
//!   by `super::krows`'s register unpacking.

use super::act::ActQ8K;
use super::kquants::{BlockQ4K, BlockQ6K};

/// Two weight columns against four rows: `[column][row]`.
pub(crate) type KTile<W> = fn([&[W]; 2], [&[ActQ8K]; 4]) -> [[f32; 4]; 2];

/// The tile kernel for Q4_K weights, where this CPU runs it.
pub(crate) fn q4_k() -> Option<KTile<BlockQ4K>> {
    imp::available().then_some(imp::q4_k as KTile<BlockQ4K>)
}

/// The tile kernel for Q6_K weights, where this CPU runs it.
pub(crate) fn q6_k() -> Option<KTile<BlockQ6K>> {
    imp::available().then_some(imp::q6_k as KTile<BlockQ6K>)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod imp {
    use std::arch::x86_64::*;

    use super::super::dot::xn::finish;
    use super::super::isa;
    use super::super::krows::{at, bsums16, nibbles, six_bits};
    use super::super::stream::prefetch;
    use super::{ActQ8K, BlockQ4K, BlockQ6K};

    // SAFETY (every block here): the `_enabled` functions run only where `available`
    // said the CPU has the instructions; each load reads 16 or 32 bytes inside the
    // fixed-size array it is given (`at` bounds the offset).

    pub(super) fn available() -> bool {
        isa::vnni() && is_x86_feature_detected!("avx512bw")
    }

    fn blocks<W>(w: &[&[W]; 2], a: &[&[ActQ8K]; 4]) -> usize {
        a.iter().map(|a| a.len()).fold(w[0].len().min(w[1].len()), usize::min)
    }

    /// Sixteen bytes in both 128-bit halves.
    #[inline(always)]
    unsafe fn both_halves<T>(v: &[T; 16]) -> __m256i {
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(v.as_ptr().cast())) }
    }

    /// Lane `i` the sum of the eight i32 lanes of `v[i]` (exact).
    #[inline(always)]
    unsafe fn sums8(v: [__m256i; 8]) -> __m256i {
        unsafe {
            let h = |a, b| _mm256_hadd_epi32(a, b);
            let (q0, q1) = (h(h(v[0], v[1]), h(v[2], v[3])), h(h(v[4], v[5]), h(v[6], v[7])));
            _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(q0, q1), _mm256_permute2x128_si256::<0x31>(q0, q1))
        }
    }

    /// `acc + madd(p, sc)` as one `vpdpwssd` (LLVM splits the intrinsic back into the
    /// `vpmaddwd` + `vpaddd` pair for generic x86-64 tuning).
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI and VL.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn dpwssd(acc: __m256i, p: __m256i, sc: __m256i) -> __m256i {
        let mut acc = acc;
        unsafe {
            std::arch::asm!("vpdpwssd {acc:y}, {p:y}, {sc:y}", acc = inout(zmm_reg) acc, p = in(zmm_reg) p,
                sc = in(zmm_reg) sc, options(pure, nomem, nostack, preserves_flags));
        }
        acc
    }

    /// Two f32 in lanes 0..4 and 4..8.
    #[inline(always)]
    unsafe fn pair(lo: f32, hi: f32) -> __m256 {
        unsafe { _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo)) }
    }

    pub(super) fn q4_k(w: [&[BlockQ4K]; 2], a: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        // SAFETY: `available` (checked before this kernel is handed out).
        unsafe { q4_k_enabled(w, a) }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512vnni")]
    unsafe fn q4_k_enabled(w: [&[BlockQ4K]; 2], a: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        // Lane 4c + r holds the dot of column c and row r.
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..blocks(&w, &a) {
            let wb = [&w[0][b], &w[1][b]];
            wb.iter().for_each(|&x| prefetch(x));
            // The eight u8 scales in both halves.
            let scales = wb.map(|x| unsafe { _mm256_broadcastsi128_si256(_mm_loadl_epi64(x.scales.as_ptr().cast())) });
            let mut lanes = [[_mm256_setzero_si256(); 4]; 2];
            for sb in 0..8 {
                // Byte `sb` into the low byte of every i16 lane, zero above it.
                let sc = scales.map(|s| _mm256_shuffle_epi8(s, _mm256_set1_epi16((0x8000 | sb) as u16 as i16)));
                let x = wb.map(|x| nibbles(x, sb));
                for r in 0..4 {
                    let y = at(&a[r][b].qs, sb * 32);
                    for c in 0..2 {
                        lanes[c][r] = unsafe { dpwssd(lanes[c][r], _mm256_maddubs_epi16(x[c], y), sc[c]) };
                    }
                }
            }
            // Each min twice, so that a `madd` with the sums of 16 gives min * sum of 32.
            let mins = wb.map(|x| {
                let m = unsafe { _mm_loadl_epi64(x.mins.as_ptr().cast()) };
                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m))
            });
            let bs: [__m256i; 4] = std::array::from_fn(|r| unsafe { bsums16(&a[r][b].bsums) });
            let isum = unsafe { sums8(std::array::from_fn(|i| lanes[i / 4][i % 4])) };
            let imin = unsafe { sums8(std::array::from_fn(|i| _mm256_madd_epi16(bs[i % 4], mins[i / 4]))) };
            let da =
                _mm256_setr_ps(a[0][b].d, a[1][b].d, a[2][b].d, a[3][b].d, a[0][b].d, a[1][b].d, a[2][b].d, a[3][b].d);
            let (d, dmin) = unsafe { (pair(wb[0].d, wb[1].d), pair(wb[0].dmin, wb[1].dmin)) };
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, da), acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, da), acc_min);
        }
        let mut out = [0.0f32; 8];
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
        [std::array::from_fn(|r| out[r]), std::array::from_fn(|r| out[4 + r])]
    }

    pub(super) fn q6_k(w: [&[BlockQ6K]; 2], a: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        // SAFETY: `available` (checked before this kernel is handed out).
        unsafe { q6_k_enabled(w, a) }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512vnni")]
    unsafe fn q6_k_enabled(w: [&[BlockQ6K]; 2], a: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        for b in 0..blocks(&w, &a) {
            let wb = [&w[0][b], &w[1][b]];
            wb.iter().for_each(|&x| prefetch(x));
            let scales = wb.map(|x| unsafe { both_halves(&x.scales) });
            let mut lanes = [[_mm256_setzero_si256(); 4]; 2];
            for g in 0..8 {
                // Lanes 0..4 take scale 2g, lanes 4..8 scale 2g + 1: the byte into both
                // bytes of each i16 lane, then an arithmetic shift extends its sign.
                let (lo, hi) = ((2 * g) as i8, (2 * g + 1) as i8);
                let pick = _mm256_setr_epi8(
                    lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi, hi,
                    hi, hi, hi, hi, hi, hi, hi,
                );
                let sc = scales.map(|s| _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(s, pick)));
                let x = wb.map(|x| six_bits(x, g));
                for r in 0..4 {
                    let y = at(&a[r][b].qs, g * 32);
                    for c in 0..2 {
                        lanes[c][r] = unsafe { dpwssd(lanes[c][r], _mm256_maddubs_epi16(x[c], y), sc[c]) };
                    }
                }
            }
            // Lane l loses 32 * (bsums[2l] * scales[2l] + bsums[2l+1] * scales[2l+1]).
            let sc16 = wb.map(|x| unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast())) });
            for r in 0..4 {
                let ab = &a[r][b];
                let bs = unsafe { bsums16(&ab.bsums) };
                for c in 0..2 {
                    let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16[c]));
                    let d = _mm256_set1_ps(ab.d * wb[c].d);
                    acc[c][r] =
                        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(lanes[c][r], offset)), acc[c][r]);
                }
            }
        }
        [finish(acc[0], [0.0; 4]), finish(acc[1], [0.0; 4])]
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
mod imp {
    use super::{ActQ8K, BlockQ4K, BlockQ6K};

    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn q4_k(_: [&[BlockQ4K]; 2], _: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        unreachable!("never handed out off x86-64")
    }

    pub(super) fn q6_k(_: [&[BlockQ6K]; 2], _: [&[ActQ8K]; 4]) -> [[f32; 4]; 2] {
        unreachable!("never handed out off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::super::act::{Q8KSign, QK_K, quantize_q8_k};
    use super::super::kquants::{self, Q4KPath, parse_q4_k, parse_q6_k};
    use super::*;

    /// Deterministic bytes with every bit pattern in play, f16 scales kept ordinary.
    fn bytes(blocks: usize, per: usize, scales: &[usize], seed: usize) -> Vec<u8> {
        let mut b: Vec<u8> = (0..blocks * per).map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8).collect();
        for blk in b.chunks_exact_mut(per) {
            for &i in scales {
                let v = half::f16::from_f32(0.01 + blk[i] as f32 / 4096.0);
                blk[i..i + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    /// `m` rows of `k` values, varied in scale and sign (row 5 all zero).
    fn acts(m: usize, k: usize) -> Vec<Vec<ActQ8K>> {
        (0..m)
            .map(|r| {
                let x: Vec<f32> = (0..k)
                    .map(|i| if r == 5 { 0.0 } else { (((i * 37 + r * 11) % 251) as f32 - 125.0) / (3.0 + r as f32) })
                    .collect();
                quantize_q8_k(&x, Q8KSign::FirstMax)
            })
            .collect()
    }

    fn check<W>(w: &[W], a: &[Vec<ActQ8K>], kb: usize, tile: KTile<W>, one: impl Fn(&[W], &[ActQ8K]) -> f32) {
        let col = |c: usize| &w[c * kb..(c + 1) * kb];
        for g in 0..a.len() / 4 {
            for c0 in [0, 2] {
                let got = tile([col(c0), col(c0 + 1)], std::array::from_fn(|j| &a[4 * g + j][..]));
                for c in 0..2 {
                    for j in 0..4 {
                        let want = one(col(c0 + c), &a[4 * g + j]);
                        assert_eq!(got[c][j].to_bits(), want.to_bits(), "group {g} column {} row {j}", c0 + c);
                    }
                }
            }
        }
    }

    #[test]
    fn k_tiles_equal_the_one_row_kernels_bit_for_bit() {
        let Some((t4, t6)) = q4_k().zip(q6_k()) else {
            eprintln!("no AVX-512 VNNI + BW here: the K-quant tiles are never used");
            return;
        };
        let (kb, n) = (5, 4);
        let a = acts(8, kb * QK_K);
        let q4 = parse_q4_k(&bytes(n * kb, 144, &[0, 2], 1));
        check(&q4, &a, kb, t4, |w, a| kquants::q4_k_q8_k(w, a, Q4KPath::Gemv));
        let q6 = parse_q6_k(&bytes(n * kb, 210, &[208], 2));
        check(&q6, &a, kb, t6, kquants::q6_k_q8_k);
    }

    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine ktile_speed -- --ignored --nocapture"]
    fn ktile_speed() {
        use std::time::Instant;
        let Some((t4, t6)) = q4_k().zip(q6_k()) else { return };
        let (kb, n, reps) = (4, 512, 20);
        let a = acts(4, kb * QK_K);
        let rows: [&[ActQ8K]; 4] = std::array::from_fn(|r| &a[r][..]);
        fn time<W>(name: &str, w: &[W], rows: [&[ActQ8K]; 4], t: KTile<W>, kb: usize, n: usize, reps: usize) {
            let start = Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps {
                for c in (0..n).step_by(2) {
                    let got = t([&w[c * kb..][..kb], &w[(c + 1) * kb..][..kb]], rows);
                    sink += got[0][0] + got[1][3];
                }
            }
            let per = start.elapsed().as_secs_f64() * 1e9 / (reps * n * kb * 4) as f64;
            eprintln!("{name} 2x4 tile: {per:.2} ns per super-block and row ({sink})");
        }
        time("q4_k", &parse_q4_k(&bytes(n * kb, 144, &[0, 2], 1)), rows, t4, kb, n, reps);
        time("q6_k", &parse_q6_k(&bytes(n * kb, 210, &[208], 2)), rows, t6, kb, n, reps);
    }
}
