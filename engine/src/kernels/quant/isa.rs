//! Which x86 instructions form the integer inner products, chosen when the process
//! starts. The build targets x86-64-v3 (AVX2, FMA); a CPU with AVX-512 VNNI (Intel Ice
//! Lake and later, AMD Zen 4 and later) does a 32-byte `u8 × i8` dot in eight lanes of
//! four with one `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd`. Both give the same
//! exact integers (the kernels' magnitudes never saturate `vpmaddubsw`'s i16 pairs), so
//! the choice never changes a result, only the instruction count.
//! `CORRAL_CPU_VNNI=0` keeps the AVX2 form (for A/B measurements).

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(super) use imp::*;

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod imp {
    use std::arch::x86_64::*;
    use std::sync::LazyLock;

    /// Eight i32 lanes, lane `l` the sum of the products of bytes `4l..4l+4` of `x`
    /// (unsigned, < 128) and `y` (signed).
    pub(in super::super) trait Isa {
        /// # Safety
        /// The CPU has the instructions of the implementing type.
        unsafe fn dot4(x: __m256i, y: __m256i) -> __m256i;
    }

    pub(in super::super) struct Avx2;

    impl Isa for Avx2 {
        #[inline(always)]
        unsafe fn dot4(x: __m256i, y: __m256i) -> __m256i {
            // SAFETY: AVX2 is a target feature of this build.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
        }
    }

    pub(in super::super) struct Vnni;

    impl Isa for Vnni {
        #[inline(always)]
        unsafe fn dot4(x: __m256i, y: __m256i) -> __m256i {
            // SAFETY: the caller runs only where `vnni()` said the CPU has AVX-512 VNNI + VL.
            unsafe { dpbusd(x, y) }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn dpbusd(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }

    /// Whether this CPU runs the VNNI forms (and they are not turned off).
    pub(in super::super) fn vnni() -> bool {
        static VNNI: LazyLock<bool> = LazyLock::new(|| {
            let off = std::env::var("CORRAL_CPU_VNNI").is_ok_and(|v| v == "0");
            !off && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        });
        *VNNI
    }
}

/// No VNNI forms off x86-64 (their portable kernels are the only ones).
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
pub(super) fn vnni() -> bool {
    false
}

/// The instruction set the quantized kernels use on this CPU, for logs and benchmarks.
pub(crate) fn describe() -> &'static str {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    return if imp::vnni() { "avx2+avx512-vnni" } else { "avx2" };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    "portable"
}
