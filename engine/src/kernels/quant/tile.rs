//! Four weight columns against four activation rows per call (prefill and batches, on
//! CPUs with AVX-512 VNNI): a register tile of sixteen (row, column) dots. Each dot keeps
//! exactly the one-row kernel's arithmetic (`super::dot`): per block the exact integer
//! lanes, `acc = fma(d_w * d_a, lanes, acc)`, ggml's horizontal sum, plus Q4_1's
//! `summs = fma(m, s, summs)` chain. What the tile changes is how many instructions
//! form those values:
//! - an activation block is loaded once for the four columns, a weight block unpacked
//!   once for all four rows;
//! - the scale products `d_w * d_a` come eight to a vector multiply (the rows'
//!   scales side by side in `Quads`) and reach their FMAs as broadcast loads, where the
//!   four-row kernel spent a multiply and a shuffle on each;
//! - Q4_1's `summs` chains are eight to a vector FMA;
//! - Q5_0's signed weights are multiplied as `q + 16` (unsigned, as `vpdpbusd` wants)
//!   with the activations' lane sums times -16 as the starting value, instead of moving
//!   the weights' signs onto every activation block. Integer sums are exact, so the
//!   lanes are the same integers.

use super::act::ActQ8;
use super::dot::{BlockQ4_1, BlockQ5_0};

/// Per group of four activation rows and block: the rows' scales, their Q8_1 sums, and
/// -16 times their lane sums (lane `l`: bytes `4l..4l+4`), laid out for the tile.
pub(crate) struct Quads {
    d: Vec<[f32; 4]>,
    s: Vec<[f32; 4]>,
    off16: Vec<[[i32; 8]; 4]>,
}

impl Quads {
    /// From `m` rows of `kb` blocks each; rows past the last whole group are left out.
    pub(crate) fn new(acts: &[ActQ8], m: usize, kb: usize) -> Self {
        let groups = m / 4;
        let mut q = Quads {
            d: Vec::with_capacity(groups * kb),
            s: Vec::with_capacity(groups * kb),
            off16: Vec::with_capacity(groups * kb),
        };
        for g in 0..groups {
            for b in 0..kb {
                let at = |r: usize| &acts[(4 * g + r) * kb + b];
                q.d.push(std::array::from_fn(|r| at(r).d));
                q.s.push(std::array::from_fn(|r| at(r).s));
                q.off16.push(std::array::from_fn(|r| {
                    let qs = &at(r).qs;
                    std::array::from_fn(|l| -16 * qs[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum::<i32>())
                }));
            }
        }
        q
    }

    /// Group `g`'s blocks.
    pub(crate) fn group(&self, g: usize, kb: usize) -> QuadsRef<'_> {
        let r = g * kb..(g + 1) * kb;
        QuadsRef { d: &self.d[r.clone()], s: &self.s[r.clone()], off16: &self.off16[r] }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct QuadsRef<'a> {
    d: &'a [[f32; 4]],
    s: &'a [[f32; 4]],
    off16: &'a [[[i32; 8]; 4]],
}

/// Columns a tile covers.
pub(crate) const TILE_COLS: usize = 4;

/// Four weight columns against four rows (whose `Quads` group is given): `[column][row]`.
pub(crate) type Tile<W> = fn([&[W]; TILE_COLS], [&[ActQ8]; 4], QuadsRef<'_>) -> [[f32; 4]; TILE_COLS];

/// The tile kernel for Q4_1 weights, where this CPU runs it.
pub(crate) fn q4_1() -> Option<Tile<BlockQ4_1>> {
    imp::available().then_some(imp::q4_1 as Tile<BlockQ4_1>)
}

/// The tile kernel for Q5_0 weights, where this CPU runs it.
pub(crate) fn q5_0() -> Option<Tile<BlockQ5_0>> {
    imp::available().then_some(imp::q5_0 as Tile<BlockQ5_0>)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod imp {
    use std::arch::x86_64::*;

    use super::super::isa;
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, QuadsRef};
    use crate::kernels::lanes::hsum8_each;

    pub(super) fn available() -> bool {
        isa::vnni()
    }

    const C: usize = super::TILE_COLS;

    fn blocks<W>(w: &[&[W]; C], a: &[&[ActQ8]; 4], q: &QuadsRef<'_>) -> usize {
        let lens = a.iter().map(|a| a.len()).chain(w.iter().map(|w| w.len()));
        lens.chain([q.d.len(), q.s.len(), q.off16.len()]).fold(usize::MAX, usize::min)
    }

    /// `acc[c][r] = fma(p[c / 2][4 (c % 2) + r], float(lanes(c, r)), acc[c][r])`, the
    /// lanes being `vpdpbusd(start[r], x[c], y[r])`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, VL and VNNI.
    #[inline(always)]
    unsafe fn fold(
        acc: &mut [[__m256; 4]; C],
        p: [__m256; C / 2],
        x: [__m256i; C],
        y: [__m256i; 4],
        start: [__m256i; 4],
    ) {
        let mut ps = [0.0f32; 4 * C];
        unsafe {
            for (h, p) in p.iter().enumerate() {
                _mm256_storeu_ps(ps.as_mut_ptr().add(8 * h), *p);
            }
            for r in 0..4 {
                for c in 0..C {
                    let lanes = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start[r], x[c], y[r]));
                    acc[c][r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ps[4 * c + r]), lanes, acc[c][r]);
                }
            }
        }
    }

    #[inline(always)]
    fn load(qs: &[i8; 32]) -> __m256i {
        // SAFETY: reads the 32 bytes of the array.
        unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) }
    }

    pub(super) fn q4_1(w: [&[BlockQ4_1]; C], a: [&[ActQ8]; 4], q: QuadsRef<'_>) -> [[f32; 4]; C] {
        // SAFETY: `available` (checked before this kernel is handed out) says the CPU
        // has the instructions.
        unsafe { q4_1_enabled(w, a, q) }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
    unsafe fn q4_1_enabled(w: [&[BlockQ4_1]; C], a: [&[ActQ8]; 4], q: QuadsRef<'_>) -> [[f32; 4]; C] {
        let mut acc = [[_mm256_setzero_ps(); 4]; C];
        // Columns 2h and 2h + 1's chains in lanes 0..4 and 4..8 of `summs[h]`.
        let mut summs = [_mm256_setzero_ps(); C / 2];
        let (lo, hi) = (_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
        let nib = _mm256_set1_epi8(0x0f);
        let zero = _mm256_setzero_si256();
        for b in 0..blocks(&w, &a, &q) {
            let wb: [&BlockQ4_1; C] = std::array::from_fn(|c| &w[c][b]);
            let unpack = |wb: &BlockQ4_1| {
                // SAFETY: reads the 16 bytes of the array.
                let v = unsafe { _mm_loadu_si128(wb.qs.as_ptr().cast()) };
                _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib)
            };
            let x = wb.map(unpack);
            let bits = |wb: &BlockQ4_1| (wb.d.to_bits() as u32 | (wb.m.to_bits() as u32) << 16) as i32;
            // SAFETY: each reads the four f32 of an array.
            let (da, sa) = unsafe {
                (_mm256_broadcast_ps(&*q.d[b].as_ptr().cast::<__m128>()), _mm256_broadcast_ps(&*q.s[b].as_ptr().cast()))
            };
            let p = std::array::from_fn(|h| {
                // [d, m of column 2h, d, m of column 2h + 1], widened exactly.
                let dm =
                    _mm256_castps128_ps256(_mm_cvtph_ps(_mm_setr_epi32(bits(wb[2 * h]), bits(wb[2 * h + 1]), 0, 0)));
                let (dw, mw) = (_mm256_permutevar8x32_ps(dm, lo), _mm256_permutevar8x32_ps(dm, hi));
                summs[h] = _mm256_fmadd_ps(mw, sa, summs[h]);
                _mm256_mul_ps(dw, da)
            });
            let y = std::array::from_fn(|r| load(&a[r][b].qs));
            unsafe { fold(&mut acc, p, x, y, [zero; 4]) };
        }
        unsafe { finish(&acc, summs) }
    }

    pub(super) fn q5_0(w: [&[BlockQ5_0]; C], a: [&[ActQ8]; 4], q: QuadsRef<'_>) -> [[f32; 4]; C] {
        // SAFETY: as in `q4_1`.
        unsafe { q5_0_enabled(w, a, q) }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
    unsafe fn q5_0_enabled(w: [&[BlockQ5_0]; C], a: [&[ActQ8]; 4], q: QuadsRef<'_>) -> [[f32; 4]; C] {
        let mut acc = [[_mm256_setzero_ps(); 4]; C];
        let sixteen = _mm256_set1_epi8(16);
        for b in 0..blocks(&w, &a, &q) {
            let wb: [&BlockQ5_0; C] = std::array::from_fn(|c| &w[c][b]);
            // q - 16 in -16..16 as the unsigned q; the offsets take the 16 back out.
            let x = wb.map(|wb| _mm256_add_epi8(load(&wb.qs), sixteen));
            // SAFETY: reads the four f32 of an array, and the eight i32 of each offset.
            let (da, start) = unsafe {
                (
                    _mm256_broadcast_ps(&*q.d[b].as_ptr().cast::<__m128>()),
                    std::array::from_fn(|r| _mm256_loadu_si256(q.off16[b][r].as_ptr().cast())),
                )
            };
            let p = std::array::from_fn(|h| {
                _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(wb[2 * h + 1].d), _mm_set1_ps(wb[2 * h].d)), da)
            });
            let y = std::array::from_fn(|r| load(&a[r][b].qs));
            unsafe { fold(&mut acc, p, x, y, start) };
        }
        unsafe { finish(&acc, [_mm256_setzero_ps(); C / 2]) }
    }

    /// Each dot's eight lanes in `hsum8`'s order plus its `extra` (columns 2h and 2h + 1
    /// in lanes 0..4 and 4..8 of `extra[h]`), eight dots side by side: the same additions
    /// as `dot::xn::finish` one dot at a time.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and VL (only the AVX2 forms are used).
    #[inline(always)]
    unsafe fn finish(acc: &[[__m256; 4]; C], extra: [__m256; C / 2]) -> [[f32; 4]; C] {
        let mut out = [[0.0f32; 4]; C];
        for (h, extra) in extra.iter().enumerate() {
            let sums = hsum8_each(std::array::from_fn(|i| acc[2 * h + i / 4][i % 4]));
            let mut l = [0.0f32; 8];
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), _mm256_add_ps(sums, *extra)) };
            out[2 * h] = std::array::from_fn(|r| l[r]);
            out[2 * h + 1] = std::array::from_fn(|r| l[4 + r]);
        }
        out
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
mod imp {
    use super::{ActQ8, BlockQ4_1, BlockQ5_0, QuadsRef};

    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn q4_1(_: [&[BlockQ4_1]; 4], _: [&[ActQ8]; 4], _: QuadsRef<'_>) -> [[f32; 4]; 4] {
        unreachable!("never handed out off x86-64")
    }

    pub(super) fn q5_0(_: [&[BlockQ5_0]; 4], _: [&[ActQ8]; 4], _: QuadsRef<'_>) -> [[f32; 4]; 4] {
        unreachable!("never handed out off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::super::act::{QK, quantize_q8_0, quantize_q8_1};
    use super::super::dot::{parse_q4_1, parse_q5_0, q4_1_q8_1, q5_0_q8_0};
    use super::*;

    /// Deterministic bytes with every bit pattern in play, f16 scales kept ordinary.
    fn bytes(blocks: usize, per: usize, scales: usize, seed: usize) -> Vec<u8> {
        let mut b: Vec<u8> = (0..blocks * per).map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8).collect();
        for blk in b.chunks_exact_mut(per) {
            for h in 0..scales {
                let v = half::f16::from_f32((0.01 + blk[2 * h] as f32 / 4096.0) * if h == 1 { -1.0 } else { 1.0 });
                blk[2 * h..2 * h + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    /// `m` rows of `k` values, varied in scale and sign (and one row all zero).
    fn rows(m: usize, k: usize) -> Vec<f32> {
        (0..m * k)
            .map(|i| {
                let r = i / k;
                if r == 5 { 0.0 } else { (((i * 37 + r * 11) % 251) as f32 - 125.0) / (3.0 + r as f32) }
            })
            .collect()
    }

    /// Every (column, row) of a tile against the one-row kernel, bit for bit, for every
    /// group of a multi-group activation matrix.
    fn check<W>(w: &[W], acts: &[ActQ8], m: usize, kb: usize, tile: Tile<W>, one: fn(&[W], &[ActQ8]) -> f32) {
        let quads = Quads::new(acts, m, kb);
        let col = |c: usize| &w[c * kb..(c + 1) * kb];
        let row = |r: usize| &acts[r * kb..(r + 1) * kb];
        for g in 0..m / 4 {
            for c0 in [0, TILE_COLS] {
                let cols = std::array::from_fn(|c| col(c0 + c));
                let got = tile(cols, std::array::from_fn(|j| row(4 * g + j)), quads.group(g, kb));
                for c in 0..TILE_COLS {
                    for j in 0..4 {
                        let want = one(col(c0 + c), row(4 * g + j));
                        assert_eq!(got[c][j].to_bits(), want.to_bits(), "group {g} column {} row {j}", c0 + c);
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_equal_the_one_row_kernels_bit_for_bit() {
        let Some((t41, t50)) = q4_1().zip(q5_0()) else {
            eprintln!("no AVX-512 VNNI here: the tile kernels are never used");
            return;
        };
        let (k, m, n) = (7 * QK, 12, 2 * TILE_COLS);
        let kb = k / QK;
        let x = rows(m, k);
        let w41 = parse_q4_1(&bytes(n * kb, 20, 2, 1));
        check(&w41, &quantize_q8_1(&x), m, kb, t41, q4_1_q8_1);
        let w50 = parse_q5_0(&bytes(n * kb, 22, 1, 2));
        check(&w50, &quantize_q8_0(&x), m, kb, t50, q5_0_q8_0);
    }

    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine tile_speed -- --ignored --nocapture"]
    fn tile_speed() {
        use std::time::Instant;
        let Some((t41, t50)) = q4_1().zip(q5_0()) else { return };
        let (k, n, m, reps) = (1024, 512, 4, 40);
        let kb = k / QK;
        let x = rows(m, k);
        let (a1, a0) = (quantize_q8_1(&x), quantize_q8_0(&x));
        let (q1, q0) = (Quads::new(&a1, m, kb), Quads::new(&a0, m, kb));
        #[allow(clippy::too_many_arguments)]
        fn time<W>(name: &str, w: &[W], a: &[ActQ8], q: &Quads, t: Tile<W>, kb: usize, n: usize, reps: usize) {
            let row = |r: usize| &a[r * kb..(r + 1) * kb];
            let start = Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps {
                for c in (0..n).step_by(TILE_COLS) {
                    let cols = std::array::from_fn(|j| &w[(c + j) * kb..][..kb]);
                    let got = t(cols, std::array::from_fn(row), q.group(0, kb));
                    sink += got[0][0] + got[3][3];
                }
            }
            let per = start.elapsed().as_secs_f64() * 1e9 / (reps * n * kb * 4) as f64;
            eprintln!("{name} 4x4 tile: {per:.3} ns per block and row ({sink})");
        }
        time("q4_1", &parse_q4_1(&bytes(n * kb, 20, 2, 1)), &a1, &q1, t41, kb, n, reps);
        time("q5_0", &parse_q5_0(&bytes(n * kb, 22, 1, 2)), &a0, &q0, t50, kb, n, reps);
    }
}
