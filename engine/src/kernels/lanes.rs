//! Horizontal sums of eight-lane vectors, eight of them side by side.

/// ggml's `hsum_float_8` of each of eight vectors — `((l4 + l0) + (l6 + l2)) + ((l5 + l1)
/// + (l7 + l3))`, which is also what is left of `reduce16` once its first step has
/// added lanes 8..16 onto lanes 0..8 — with the same additions done side by side: lane
/// `i` of the result is vector `i`'s sum, bit for bit the one-vector order.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
#[inline(always)]
pub(crate) fn hsum8_each(t: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is a target feature of this build; no memory is touched.
    unsafe {
        // Lanes i and i + 4 of vectors r and r + 1: [r | r + 1].
        let fold = |a: __m256, b: __m256| {
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
        };
        // Then (0 + 2, 1 + 3): [r: both, r + 2: both | r + 1: both, r + 3: both].
        let pairs =
            |a: __m256, b: __m256| _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
        let z0 = pairs(fold(t[0], t[1]), fold(t[2], t[3]));
        let z1 = pairs(fold(t[4], t[5]), fold(t[6], t[7]));
        // The last addition: vectors [0, 2, 4, 6 | 1, 3, 5, 7], put in order.
        let r = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(z0, z1), _mm256_shuffle_ps::<0xDD>(z0, z1));
        _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

#[cfg(all(test, target_arch = "x86_64", target_feature = "avx2"))]
mod tests {
    use std::arch::x86_64::*;

    /// Every lane is the one-vector sum, bit for bit, on values where the order shows.
    #[test]
    fn side_by_side_sums_equal_one_at_a_time() {
        let v: Vec<[f32; 8]> = (0..8)
            .map(|r| std::array::from_fn(|l| ((r * 8 + l) as f32 * 0.37 - 9.0) * [1.0, 1e7, 1e-7, -3.0][l % 4]))
            .collect();
        // SAFETY: AVX2 is a target feature of this build; loads and the store touch the arrays.
        let got = unsafe {
            let s = super::hsum8_each(std::array::from_fn(|r| _mm256_loadu_ps(v[r].as_ptr())));
            let mut out = [0.0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), s);
            out
        };
        for (r, a) in v.iter().enumerate() {
            let want = ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
            assert_eq!(got[r].to_bits(), want.to_bits(), "vector {r}");
        }
    }
}
