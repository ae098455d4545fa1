//! Attention scores of a tile (`super::tile`): eight keys at a time, each key's 16 lane
//! sums in two vectors as in `Order::dot`, the eight lane reductions done side by side
//! with the same additions (`lanes8`). On CPUs with AVX-512 the query stays in sixteen
//! 512-bit registers and two of the 8-wide chains run side by side in one (the same
//! fused multiply-adds per lane, so the same bits); with AVX2 alone, half the query of a
//! 256-wide head does not fit the 16 registers and is reloaded for every key.

use half::slice::HalfFloatSliceExt;

use super::order::{LANES, Order};
use super::probs::SlotMajor;
use super::tile::KvRows;

/// Scaled scores of every item at every key it sees, into `out` (`[entry][item]`, entries
/// of `slots`; the rest is left as it is).
pub(super) fn score_keys(
    rows: &KvRows,
    order: Order,
    qs: &[f32],
    items: &[(usize, usize)],
    scale: f32,
    slots: &SlotMajor,
    out: &mut [f32],
) {
    let (hd, n) = (rows.hd, items.len());
    let mut kbuf = vec![0.0f32; 8 * hd];
    let eight = lanes8_fits(order, hd);
    let mut j = rows.jlo;
    while j <= rows.jhi {
        let m = if eight && j + 8 <= rows.jhi + 1 { 8 } else { 1 };
        let mut at = [0usize; 8];
        for r in 0..m {
            rows.k(j + r).convert_to_f32_slice(&mut kbuf[r * hd..][..hd]);
            at[r] = slots.at(j + r) * n;
        }
        for (i, &(lo, pos)) in items.iter().enumerate() {
            if j + m <= lo || j > pos {
                continue;
            }
            let qi = &qs[i * hd..][..hd];
            let s = if m == 8 { lanes8(order, qi, &kbuf) } else { [order.dot(qi, &kbuf[..hd]); 8] };
            for r in 0..m {
                if (lo..=pos).contains(&(j + r)) {
                    out[at[r] + i] = s[r] * scale;
                }
            }
        }
        j += m;
    }
}

/// Whether `lanes8` computes `order.dot` for this head size (no f64 tail).
fn lanes8_fits(order: Order, hd: usize) -> bool {
    match order {
        Order::Batched => hd.is_multiple_of(LANES),
        Order::Single => hd.is_multiple_of(64),
    }
}

/// `order.dot(q, k_r)` for eight rows `k` (`[8][hd]`), each bit for bit.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn lanes8(order: Order, q: &[f32], k: &[f32]) -> [f32; 8] {
    let wide = avx512();
    match (order, q.len()) {
        (Order::Single, 64) => lanes8_at::<64, true>(wide, q, k),
        (Order::Single, 128) => lanes8_at::<128, true>(wide, q, k),
        (Order::Single, 256) => lanes8_at::<256, true>(wide, q, k),
        (Order::Batched, 64) => lanes8_at::<64, false>(wide, q, k),
        (Order::Batched, 128) => lanes8_at::<128, false>(wide, q, k),
        (Order::Batched, 256) => lanes8_at::<256, false>(wide, q, k),
        _ => std::array::from_fn(|r| order.dot(q, &k[r * q.len()..][..q.len()])),
    }
}

/// `lanes8` for head size `HD`, with 512-bit vectors if `wide` (the CPU has AVX-512 F).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
fn lanes8_at<const HD: usize, const SINGLE: bool>(wide: bool, q: &[f32], k: &[f32]) -> [f32; 8] {
    if wide {
        // SAFETY: `wide` says the CPU has AVX-512 F (`avx512`).
        unsafe { lanes8_512::<HD, SINGLE>(q, k) }
    } else {
        lanes8_hd::<HD, SINGLE>(q, k)
    }
}

/// `lanes8` for head size `HD`, in the one-row order if `SINGLE`. The query's `HD / 8`
/// vectors are loaded once for the eight keys.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
fn lanes8_hd<const HD: usize, const SINGLE: bool>(q: &[f32], k: &[f32]) -> [f32; 8] {
    use std::arch::x86_64::*;
    assert!(q.len() == HD && HD <= 256 && k.len() >= 8 * HD);
    // SAFETY: AVX2 and FMA are target features of this build; every load reads 8 floats
    // at an offset + 8 <= HD of `q` or of one of `k`'s eight rows (asserted above).
    unsafe {
        // (HD / 8 of them: an array length cannot depend on HD in stable Rust.)
        let qv: [__m256; 32] =
            std::array::from_fn(
                |c| if c < HD / 8 { _mm256_loadu_ps(q.as_ptr().add(c * 8)) } else { _mm256_setzero_ps() },
            );
        let pk = k.as_ptr();
        // The first step of `reduce16` for row `r`: (lanes 8..16) + (lanes 0..8).
        let t3 = |r: usize| {
            let pr = pk.add(r * HD);
            let kv = |i: usize| _mm256_loadu_ps(pr.add(i));
            if SINGLE {
                // Eight chains over 64-wide steps: chain c takes items 64 s + 8 c.
                let mut acc = [_mm256_setzero_ps(); 8];
                for s in 0..HD / 64 {
                    for (c, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(qv[s * 8 + c], kv(s * 64 + c * 8), *acc);
                    }
                }
                let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
                let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
                _mm256_add_ps(hi, lo)
            } else {
                let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for s in 0..HD / LANES {
                    lo = _mm256_fmadd_ps(qv[2 * s], kv(s * LANES), lo);
                    hi = _mm256_fmadd_ps(qv[2 * s + 1], kv(s * LANES + 8), hi);
                }
                _mm256_add_ps(hi, lo)
            }
        };
        finish8(std::array::from_fn(t3))
    }
}

/// `lanes8_hd` with 512-bit vectors: the query in (up to) sixteen registers, two 8-wide
/// chains side by side in each accumulator, lane for lane the same operations.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[target_feature(enable = "avx512f")]
unsafe fn lanes8_512<const HD: usize, const SINGLE: bool>(q: &[f32], k: &[f32]) -> [f32; 8] {
    use std::arch::x86_64::*;
    assert!(q.len() == HD && HD <= 256 && HD.is_multiple_of(64) && k.len() >= 8 * HD);
    // SAFETY: every load reads 16 floats at an offset + 16 <= HD of `q` or of one of `k`'s
    // eight rows (asserted above).
    unsafe {
        let qv: [__m512; 16] = std::array::from_fn(|c| {
            if c < HD / 16 { _mm512_loadu_ps(q.as_ptr().add(c * 16)) } else { _mm512_setzero_ps() }
        });
        let halves =
            |z: __m512| (_mm512_castps512_ps256(z), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z))));
        let t3 = |r: usize| {
            let pr = k.as_ptr().add(r * HD);
            let kv = |i: usize| _mm512_loadu_ps(pr.add(i));
            if SINGLE {
                // Register p holds chains 2p and 2p + 1 (items 64 s + 16 p ..+ 16).
                let mut acc = [_mm512_setzero_ps(); 4];
                for s in 0..HD / 64 {
                    for (p, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_fmadd_ps(qv[s * 4 + p], kv(s * 64 + p * 16), *acc);
                    }
                }
                // [(c0 + c4) + (c2 + c6) | (c1 + c5) + (c3 + c7)] = [lo | hi].
                let (lo, hi) = halves(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])));
                _mm256_add_ps(hi, lo)
            } else {
                // One chain: lanes 0..8 are `lo`'s, 8..16 `hi`'s.
                let mut acc = _mm512_setzero_ps();
                for s in 0..HD / LANES {
                    acc = _mm512_fmadd_ps(qv[s], kv(s * LANES), acc);
                }
                let (lo, hi) = halves(acc);
                _mm256_add_ps(hi, lo)
            }
        };
        finish8(std::array::from_fn(t3))
    }
}

/// The rest of `reduce16` for eight rows side by side, from each row's first step
/// ((lanes 8..16) + (lanes 0..8)), into the eight sums in row order.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
fn finish8(t: [std::arch::x86_64::__m256; 8]) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: AVX2 is a target feature of this build; the store writes `out`'s 8 floats.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), crate::kernels::lanes::hsum8_each(t)) };
    out
}

/// Whether this CPU has AVX-512 F (`CORRAL_CPU_AVX512=0` says no, for A/B runs).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(super) fn avx512() -> bool {
    static HAS: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        !std::env::var("CORRAL_CPU_AVX512").is_ok_and(|v| v == "0") && std::arch::is_x86_feature_detected!("avx512f")
    });
    *HAS
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn lanes8(order: Order, q: &[f32], k: &[f32]) -> [f32; 8] {
    let hd = q.len();
    std::array::from_fn(|r| order.dot(q, &k[r * hd..][..hd]))
}
