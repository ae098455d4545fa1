//! The integer inner products every quantized kernel is built from: 32 byte pairs in,
//! eight i32 lanes out, lane `l` summing the products of bytes `4l..4l+4` (the lane
//! layout of x86's `maddubs` + `madd`, which the float accumulation order of the
//! kernels depends on). Integer sums are exact, so the AVX2 and portable versions are
//! interchangeable bit for bit; the AVX2 one is used when the build targets AVX2. Also
//! the unpacking of packed 4- and 6-bit values (Q4_K, Q6_K) into one byte a value, which
//! the compiler does not vectorize well from a plain loop.

// SAFETY (every block in this module): the module exists only in builds whose target
// has AVX2 (so the CPU running the binary has it), and each load/store touches exactly
// the bytes of the fixed-size array it is given.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod imp {
    use std::arch::x86_64::*;

    #[inline]
    unsafe fn lanes(p16: __m256i) -> [i32; 8] {
        let mut out = [0i32; 8];
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_madd_epi16(p16, _mm256_set1_epi16(1))) };
        out
    }

    /// Unsigned bytes (values < 128) times signed bytes.
    #[inline]
    pub fn u8_i8(x: &[u8; 32], y: &[i8; 32]) -> [i32; 8] {
        unsafe {
            let (xv, yv) = (_mm256_loadu_si256(x.as_ptr().cast()), _mm256_loadu_si256(y.as_ptr().cast()));
            lanes(_mm256_maddubs_epi16(xv, yv))
        }
    }

    /// Signed bytes times signed bytes (|x| made unsigned, its sign moved onto y).
    #[inline]
    pub fn i8_i8(x: &[i8; 32], y: &[i8; 32]) -> [i32; 8] {
        unsafe {
            let (xv, yv) = (_mm256_loadu_si256(x.as_ptr().cast()), _mm256_loadu_si256(y.as_ptr().cast()));
            lanes(_mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv)))
        }
    }

    /// Bits `shift..shift + 4` of each byte (4-bit values packed two a byte).
    #[inline]
    pub fn nibbles(v: &[u8; 32], shift: u32) -> [u8; 32] {
        let mut out = [0u8; 32];
        unsafe {
            let x = _mm256_srl_epi16(_mm256_loadu_si256(v.as_ptr().cast()), _mm_cvtsi32_si128(shift as i32));
            _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_and_si256(x, _mm256_set1_epi8(0x0f)));
        }
        out
    }

    /// 6-bit values from bits `lo..lo + 4` of `ql` and bits `hi..hi + 2` of `qh` (as bits
    /// 4 and 5). The 16-bit shifts carry bits across bytes only into places the masks clear.
    #[inline]
    pub fn six_bits(ql: &[u8; 32], lo: u32, qh: &[u8; 32], hi: u32) -> [u8; 32] {
        let mut out = [0u8; 32];
        unsafe {
            let l = _mm256_srl_epi16(_mm256_loadu_si256(ql.as_ptr().cast()), _mm_cvtsi32_si128(lo as i32));
            let h = _mm256_srl_epi16(_mm256_loadu_si256(qh.as_ptr().cast()), _mm_cvtsi32_si128(hi as i32));
            let h = _mm256_slli_epi16::<4>(_mm256_and_si256(h, _mm256_set1_epi8(3)));
            let x = _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi8(0x0f)), h);
            _mm256_storeu_si256(out.as_mut_ptr().cast(), x);
        }
        out
    }

    /// 32 packed 4-bit values (low nibbles are elements 0..16) times signed bytes.
    #[inline]
    pub fn nib4_i8(qs: &[u8; 16], y: &[i8; 32]) -> [i32; 8] {
        unsafe {
            let (lo, yv) = (_mm_loadu_si128(qs.as_ptr().cast()), _mm256_loadu_si256(y.as_ptr().cast()));
            let x = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(lo, 4), lo), _mm256_set1_epi8(0x0f));
            lanes(_mm256_maddubs_epi16(x, yv))
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
mod imp {
    #[inline]
    fn lanes(f: impl Fn(usize) -> i32) -> [i32; 8] {
        std::array::from_fn(|l| (0..4).map(|e| f(4 * l + e)).sum())
    }

    pub fn u8_i8(x: &[u8; 32], y: &[i8; 32]) -> [i32; 8] {
        lanes(|i| x[i] as i32 * y[i] as i32)
    }

    pub fn i8_i8(x: &[i8; 32], y: &[i8; 32]) -> [i32; 8] {
        lanes(|i| x[i] as i32 * y[i] as i32)
    }

    pub fn nib4_i8(qs: &[u8; 16], y: &[i8; 32]) -> [i32; 8] {
        lanes(|i| if i < 16 { (qs[i] & 0xf) as i32 } else { (qs[i - 16] >> 4) as i32 } * y[i] as i32)
    }

    pub fn nibbles(v: &[u8; 32], shift: u32) -> [u8; 32] {
        v.map(|b| (b >> shift) & 0xf)
    }

    pub fn six_bits(ql: &[u8; 32], lo: u32, qh: &[u8; 32], hi: u32) -> [u8; 32] {
        std::array::from_fn(|l| ((ql[l] >> lo) & 0xf) | (((qh[l] >> hi) & 3) << 4))
    }
}

pub(crate) use imp::{i8_i8, nib4_i8, nibbles, six_bits, u8_i8};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_layout_is_four_consecutive_bytes() {
        let x: [i8; 32] = std::array::from_fn(|i| i as i8 - 16);
        let y: [i8; 32] = std::array::from_fn(|i| ((i * 7 % 11) as i8) - 5);
        let want: [i32; 8] = std::array::from_fn(|l| (0..4).map(|e| x[4 * l + e] as i32 * y[4 * l + e] as i32).sum());
        assert_eq!(i8_i8(&x, &y), want);
        let xu: [u8; 32] = std::array::from_fn(|i| (i * 2) as u8);
        let want: [i32; 8] = std::array::from_fn(|l| (0..4).map(|e| xu[4 * l + e] as i32 * y[4 * l + e] as i32).sum());
        assert_eq!(u8_i8(&xu, &y), want);
        let qs: [u8; 16] = std::array::from_fn(|i| (i as u8) | ((15 - i as u8) << 4));
        let vals: [i32; 32] = std::array::from_fn(|i| if i < 16 { i as i32 } else { 31 - i as i32 });
        let want: [i32; 8] = std::array::from_fn(|l| (0..4).map(|e| vals[4 * l + e] * y[4 * l + e] as i32).sum());
        assert_eq!(nib4_i8(&qs, &y), want);
        let packed: [u8; 32] = std::array::from_fn(|i| (i * 37 + 11) as u8);
        let hb: [u8; 32] = std::array::from_fn(|i| (i * 73 + 5) as u8);
        for shift in [0, 4] {
            assert_eq!(nibbles(&packed, shift), packed.map(|b| (b >> shift) & 0xf));
        }
        for (lo, hi) in [(0, 0), (0, 2), (4, 4), (4, 6)] {
            let want: [u8; 32] = std::array::from_fn(|l| ((packed[l] >> lo) & 0xf) | (((hb[l] >> hi) & 3) << 4));
            assert_eq!(six_bits(&packed, lo, &hb, hi), want);
        }
        let neg = [-128i8; 32];
        assert_eq!(i8_i8(&neg, &[127; 32]), [-128 * 127 * 4; 8]);
    }
}
