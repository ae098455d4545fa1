//! ggml's accumulation orders for attention's two dot products (q·k per key, and the
//! probability-weighted V sum per dim), and the SIMD that computes them: each lane a
//! chain of single-rounding FMAs in element order, lanes combined in ggml's order.

/// Which of ggml's dot-product accumulation orders applies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// Two or more query rows: tinyBLAS, 16 lanes.
    Batched,
    /// One query row: `ggml_vec_dot_f16`, 4 x 16 lanes over 64-element steps.
    Single,
}

pub(super) const LANES: usize = 16;

impl Order {
    #[inline]
    pub(super) fn dot(self, q: &[f32], k: &[f32]) -> f32 {
        match self {
            Order::Batched => dot_lanes(q, k),
            Order::Single => dot_vec_f16(q, k),
        }
    }

    /// Accumulator slots of the V sum: ggml's lanes (4 x 16 for the one-row kernel).
    pub(super) fn slots(self) -> usize {
        match self {
            Order::Batched => LANES,
            Order::Single => 4 * LANES,
        }
    }

    /// Combine `acc` (`[slot][dim]`) into one value per dim in ggml's order: per lane the
    /// groups (Single: (0 + 2) + (1 + 3)), then `reduce16` across lanes — written as
    /// whole-row operations over the dims so they vectorize.
    pub(super) fn reduce_lanes(self, acc: &[f32], hd: usize, out: &mut [f32]) {
        thread_local! {
            /// The `[lane][dim]` scratch, kept per thread: a fresh zeroed one per (row,
            /// head) cost 2 % of SmolLM2's prefill in allocation and clearing.
            static LANE_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        LANE_SUMS.with_borrow_mut(|x| {
            x.resize(LANES * hd, 0.0);
            self.reduce_lanes_into(acc, hd, &mut x[..LANES * hd], out)
        });
    }

    /// `reduce_lanes` with its scratch `x` (`[lane][dim]`, every element written first).
    fn reduce_lanes_into(self, acc: &[f32], hd: usize, x: &mut [f32], out: &mut [f32]) {
        let row = |slot: usize| &acc[slot * hd..][..hd];
        for (l, xl) in x.chunks_exact_mut(hd).enumerate() {
            match self {
                Order::Batched => xl.copy_from_slice(row(l)),
                Order::Single => {
                    let (a, b, c, d) = (row(l), row(LANES + l), row(2 * LANES + l), row(3 * LANES + l));
                    for (i, o) in xl.iter_mut().enumerate() {
                        *o = (a[i] + c[i]) + (b[i] + d[i]);
                    }
                }
            }
        }
        reduce16_lanes(x, hd, out);
    }
}

/// `reduce16` per dim of `x` (`[lane][dim]`, 16 lanes of `hd` dims; used as scratch)
/// into `out`, written as whole-row operations over the dims so they vectorize.
pub(super) fn reduce16_lanes(x: &mut [f32], hd: usize, out: &mut [f32]) {
    // reduce16 lane-wise: t3[i] = x[i + 8] + x[i], t6[i] = t3[i + 4] + t3[i],
    // out = (t6[0] + t6[2]) + (t6[1] + t6[3]).
    let (lo, hi) = x[..LANES * hd].split_at_mut(8 * hd);
    for (a, b) in lo.iter_mut().zip(hi.iter()) {
        *a += *b; // IEEE addition commutes: b + a == a + b bit for bit
    }
    let (lo, hi) = lo.split_at_mut(4 * hd);
    for (a, b) in lo.iter_mut().zip(hi[..4 * hd].iter()) {
        *a += *b; // IEEE addition commutes: b + a == a + b bit for bit
    }
    for (d, o) in out.iter_mut().enumerate() {
        *o = (lo[d] + lo[2 * hd + d]) + (lo[hd + d] + lo[3 * hd + d]);
    }
}

/// GCC's `_mm512_reduce_add_ps`: halves, then quarters, then pairs.
#[inline]
pub(super) fn reduce16(a: &[f32; LANES]) -> f32 {
    let mut t3 = [0.0f32; 8];
    for i in 0..8 {
        t3[i] = a[i + 8] + a[i];
    }
    let t6 = [t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]];
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// tinyBLAS order: lane `i % 16` accumulates element `i` by FMA, lanes reduced at the end.
/// `k` is a multiple of 16 for every supported head size.
#[inline]
pub(crate) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    reduce16(&lanes::fma16(a, b))
}

/// `ggml_vec_dot_f16` order (AVX-512): four 16-lane accumulators over 64-element steps,
/// combined (0+2), (1+3), then together; any tail summed in f64.
#[inline]
fn dot_vec_f16(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !63;
    let mut sum = reduce16(&lanes::fma4x16(&a[..np], &b[..np])) as f64;
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `ggml_vec_dot_f32` order (AVX-512), as `dot_vec_f16` but with its tail summed in f32
/// (`sumf += x * y`, contracted to an FMA by ggml's x86 build): the Gated DeltaNet's
/// state-times-vector products.
#[inline]
pub(crate) fn dot_vec_f32(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !63;
    let mut sum = reduce16(&lanes::fma4x16(&a[..np], &b[..np]));
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

/// The lane accumulations of the two dot orders. Each lane is a chain of single-rounding
/// FMAs in element order, so the AVX2 and portable versions agree bit for bit.
mod lanes {
    use super::LANES;

    /// Lane `l` = FMA chain over elements `i ≡ l (mod 16)`; `a.len()` a multiple of 16.
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    #[inline]
    pub fn fma16(a: &[f32], b: &[f32]) -> [f32; LANES] {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len()) / LANES * LANES;
        let mut out = [0.0f32; LANES];
        // SAFETY: AVX2 and FMA are target features of this build; every load reads 8
        // floats at an offset + 8 <= n within both slices, the store writes `out`'s 16.
        unsafe {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            for i in (0..n).step_by(LANES) {
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)), hi);
            }
            _mm256_storeu_ps(out.as_mut_ptr(), lo);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), hi);
        }
        out
    }

    /// Four 16-lane FMA chains over 64-element steps (group `g` takes elements
    /// `64s + 16g + l`), combined per lane as (0 + 2) + (1 + 3); `a.len()` a multiple of 64.
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    #[inline]
    pub fn fma4x16(a: &[f32], b: &[f32]) -> [f32; LANES] {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len()) / 64 * 64;
        let mut out = [0.0f32; LANES];
        // SAFETY: as in `fma16`; offsets + 8 <= n.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            for s in (0..n).step_by(64) {
                for (k, acc) in acc.iter_mut().enumerate() {
                    let i = s + k * 8;
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), *acc);
                }
            }
            // acc[2g] holds lanes 0..8 of group g, acc[2g + 1] lanes 8..16.
            let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
            _mm256_storeu_ps(out.as_mut_ptr(), lo);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), hi);
        }
        out
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    pub fn fma16(a: &[f32], b: &[f32]) -> [f32; LANES] {
        portable::fma16(a, b)
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    pub fn fma4x16(a: &[f32], b: &[f32]) -> [f32; LANES] {
        portable::fma4x16(a, b)
    }

    #[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"), allow(dead_code))]
    pub mod portable {
        use super::LANES;

        pub fn fma16(a: &[f32], b: &[f32]) -> [f32; LANES] {
            let mut acc = [0.0f32; LANES];
            for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
                for l in 0..LANES {
                    acc[l] = ca[l].mul_add(cb[l], acc[l]);
                }
            }
            acc
        }

        pub fn fma4x16(a: &[f32], b: &[f32]) -> [f32; LANES] {
            let mut acc = [[0.0f32; LANES]; 4];
            for (ca, cb) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
                for (grp, accg) in acc.iter_mut().enumerate() {
                    for l in 0..LANES {
                        let i = grp * LANES + l;
                        accg[l] = ca[i].mul_add(cb[i], accg[l]);
                    }
                }
            }
            std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_lanes_equal_portable_lanes_bit_for_bit() {
        let f = |i: usize| (((i * 7919) % 2003) as f32 / 977.0 - 1.0) * (1.0 + (i % 7) as f32 * 1e-3);
        for n in [64, 128, 256] {
            let a: Vec<f32> = (0..n).map(f).collect();
            let b: Vec<f32> = (0..n).map(|i| f(i + 31)).collect();
            let bits = |x: [f32; LANES]| x.map(f32::to_bits);
            assert_eq!(bits(lanes::fma16(&a, &b)), bits(lanes::portable::fma16(&a, &b)));
            assert_eq!(bits(lanes::fma4x16(&a, &b)), bits(lanes::portable::fma4x16(&a, &b)));
        }
    }

    #[test]
    fn lane_reduction_is_reduce16_per_dim() {
        let hd = 24;
        let acc: Vec<f32> = (0..4 * LANES * hd).map(|i| ((i * 7919 % 1009) as f32 - 500.0) / 37.0).collect();
        for order in [Order::Single, Order::Batched] {
            let mut got = vec![0.0f32; hd];
            order.reduce_lanes(&acc, hd, &mut got);
            for (d, g) in got.iter().enumerate() {
                let lane = |grp: usize, l: usize| acc[(grp * LANES + l) * hd + d];
                let x: [f32; LANES] = std::array::from_fn(|l| match order {
                    Order::Batched => lane(0, l),
                    Order::Single => (lane(0, l) + lane(2, l)) + (lane(1, l) + lane(3, l)),
                });
                assert_eq!(g.to_bits(), reduce16(&x).to_bits());
            }
        }
    }

    #[test]
    fn lane_orders_sum_correctly() {
        let a: Vec<f32> = (0..256).map(|i| i as f32 * 0.5).collect();
        let b = vec![2.0f32; 256];
        let want: f32 = a.iter().sum::<f32>() * 2.0;
        assert_eq!(dot_lanes(&a, &b), want);
        assert_eq!(dot_vec_f16(&a, &b), want);
        assert_eq!(dot_vec_f16(&a[..100], &b[..100]), a[..100].iter().sum::<f32>() * 2.0);
    }
}
