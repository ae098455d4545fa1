//! Row-wise f32 ops of the transformer block: RMSNorm, gated activations, residual add
//! (rotary embedding: `super::rope`). Written as plain loops over
//! contiguous rows so the compiler vectorizes them. Numerics follow ggml's x86 CPU kernels
//! exactly (see `super::attention` for why): f64 sum of squares in RMSNorm, SiLU through
//! ggml's polynomial `exp`, GELU through its f16 table.

use std::sync::OnceLock;

use half::f16;

/// In place: each row of width `w.len()` becomes `x / rms(x) * w`.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    by_rows(x, w.len(), 4, |rows, _| {
        for row in rows.chunks_exact_mut(w.len()) {
            let scale = rms_scale(row, eps);
            for (v, g) in row.iter_mut().zip(w) {
                *v = *v * scale * g;
            }
        }
    });
}

/// Values per pool task of the row-wise ops.
const ROWS_CHUNK: usize = 16 << 10;

/// `f(rows, first row)` over whole rows of `x` (`width` values each), several rows a task
/// on the worker pool when there are enough (`cost` per value weighs the work): a
/// prefill's norms and adds on the calling thread alone left the other waiting. Rows
/// are independent, so the split changes no value.
pub(super) fn by_rows(x: &mut [f32], width: usize, cost: usize, f: impl Fn(&mut [f32], usize) + Sync) {
    let per = (ROWS_CHUNK / width.max(1)).max(1);
    let work = x.len() * cost;
    super::parallel_chunks(x, per * width.max(1), work, |i, rows| f(rows, i * per));
}

/// `rms_norm_inplace` into a new buffer.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    rms_norm_inplace(&mut out, w, eps);
    out
}

/// ggml's `rms_norm` factor of one row: `1 / sqrt(mean(x²) + eps)`, the squares summed in
/// f64.
pub(crate) fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    by_rows(x, 1, 1, |part, at| {
        for (a, b) in part.iter_mut().zip(&y[at..]) {
            *a += b;
        }
    });
}

/// `x[t] += b` for every row `t` of `x` (a bias; ggml's broadcast add, one rounding each).
pub fn add_rows_inplace(x: &mut [f32], b: &[f32]) {
    by_rows(x, b.len(), 1, |rows, _| {
        for row in rows.chunks_exact_mut(b.len()) {
            for (a, c) in row.iter_mut().zip(b) {
                *a += c;
            }
        }
    });
}

pub fn scale_inplace(x: &mut [f32], s: f32) {
    by_rows(x, 1, 1, |part, _| {
        for v in part {
            *v *= s;
        }
    });
}

/// Elements per pool task of the gated activations (a multiple of 16, so that ggml's
/// 16-wide groups fall the same way in every chunk). On a prefill chunk they were the
/// calling thread's work alone while the other waited (3-4 % of SmolLM2's prefill).
const GATE_CHUNK: usize = 16 << 10;

/// `g = silu(g) * u` (SwiGLU). ggml vectorizes whole 16-wide groups with its own `exp`
/// and finishes a ragged tail with libm's.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    super::parallel_chunks(g, GATE_CHUNK, g.len() * 8, |i, g| silu_mul_serial(g, &u[i * GATE_CHUNK..]));
}

/// gpt-oss's SwiGLU-OAI as ggml's CPU op computes it (`swiglu_oai`, α 1.702, limit 7),
/// element by element with libm's `expf`: the gate capped at 7, the up value clamped to
/// ±7, `g = g / (1 + exp(α · -g)) * (u + 1)`.
pub fn swiglu_oai(g: &mut [f32], u: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in g.iter_mut().zip(u) {
        let x = if LIMIT < *g { LIMIT } else { *g };
        let y = u.clamp(-LIMIT, LIMIT);
        *g = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
    }
}

fn silu_mul_serial(g: &mut [f32], u: &[f32]) {
    let simd = g.len() & !15;
    // Two loops, not a choice per element: the compiler computed both `exp`s for every
    // element to select one.
    let (head, tail) = g.split_at_mut(simd);
    for (a, b) in head.iter_mut().zip(u) {
        *a = (*a / (1.0 + expf(0.0 - *a))) * b;
    }
    for (a, b) in tail.iter_mut().zip(&u[simd..]) {
        *a = (*a / (1.0 + (-*a).exp())) * b;
    }
}

/// `g = gelu(g) * u` (GeGLU, tanh approximation), through ggml's table of GELU at every
/// f16 input rounded to f16.
pub fn gelu_mul(g: &mut [f32], u: &[f32]) {
    super::parallel_chunks(g, GATE_CHUNK, g.len() * 4, |i, g| gelu_mul_serial(g, &u[i * GATE_CHUNK..]));
}

fn gelu_mul_serial(g: &mut [f32], u: &[f32]) {
    let table = gelu_table();
    for (a, b) in g.iter_mut().zip(u) {
        let x = *a;
        *a = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * b
        } else {
            table[f16::from_f32(x).to_bits() as usize].to_f32() * b
        };
    }
}

fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const GELU_COEF_A: f32 = 0.044715;
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                let inner = SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0);
                f16::from_f32(0.5 * x * (1.0 + inner.tanh()))
            })
            .collect()
    })
}

/// ggml's vectorized `expf` (`ggml_v_expf`), lane by lane: a degree-5 polynomial on a
/// reduced argument, scaled by 2^n; results under/overflow to 0/inf past |n| > 192.
pub(crate) fn expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // scalef: j * 2^n with a single rounding (exact in f64, then one f32 rounding). 2^n
    // is built from its exponent bits: |n| <= 192 is always a normal f64.
    let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * pow2) as f32
}

/// `xs[i] = expf(xs[i] - sub)` for every element, eight lanes at a time where the CPU has
/// AVX2 and FMA: the same operations as `expf` in each lane (the scale by 2^n in f64,
/// then one rounding to f32), so the results are bit-identical to the scalar form.
pub(crate) fn expf_shifted(xs: &mut [f32], sub: f32) {
    let done = simd_expf_shifted(xs, sub);
    for x in &mut xs[done..] {
        *x = expf(*x - sub);
    }
}

/// `xs[i] = expf(xs[i] - subs[i])` for every element (`subs` at least as long), with
/// `expf_shifted`'s arithmetic.
pub(crate) fn expf_shifted_each(xs: &mut [f32], subs: &[f32]) {
    let subs = &subs[..xs.len()];
    let done = simd_expf_shifted_each(xs, subs);
    for (x, s) in xs[done..].iter_mut().zip(&subs[done..]) {
        *x = expf(*x - s);
    }
}

/// The vector part of `expf_shifted`; returns how many leading elements it did.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn simd_expf_shifted(xs: &mut [f32], sub: f32) -> usize {
    use std::arch::x86_64::*;
    let n8 = xs.len() / 8 * 8;
    // SAFETY: AVX2 and FMA are target features of this build; each load and store
    // touches the 8 floats at `i < n8 <= xs.len()`.
    unsafe {
        let sub = _mm256_set1_ps(sub);
        for i in (0..n8).step_by(8) {
            let p = xs.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), sub)));
        }
    }
    n8
}

/// The vector part of `expf_shifted_each`; returns how many leading elements it did.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn simd_expf_shifted_each(xs: &mut [f32], subs: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n8 = xs.len().min(subs.len()) / 8 * 8;
    // SAFETY: AVX2 and FMA are target features of this build; each load and store
    // touches the 8 floats at `i < n8 <= len` of `xs` or `subs`.
    unsafe {
        for i in (0..n8).step_by(8) {
            let p = xs.as_mut_ptr().add(i);
            let x = _mm256_sub_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(subs.as_ptr().add(i)));
            _mm256_storeu_ps(p, exp8(x));
        }
    }
    n8
}

/// `expf` of eight lanes.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = |bits: u32| unsafe { _mm256_set1_ps(f32::from_bits(bits)) };
    // SAFETY: AVX2 and FMA are target features of this build; register operations only.
    unsafe {
        let r = c(0x4b40_0000);
        let (l2e, ln_hi, ln_lo) = (c(0x3fb8_aa3b), c(0x3f31_7200), c(0x35bf_be8e));
        let (p4, p5, p6, p7, p8) = (c(0x3c07_2010), c(0x3d2b_9f17), c(0x3e2a_af33), c(0x3eff_fedb), c(0x3f7f_fff6));
        let (one, limit, inf) = (_mm256_set1_ps(1.0), _mm256_set1_ps(192.0), _mm256_set1_ps(f32::INFINITY));
        let sign = _mm256_set1_ps(-0.0);
        let bias = _mm256_set1_epi64x(1023);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(x, l2e, r), r);
        let neg = _mm256_xor_ps(n, sign);
        let b = _mm256_fmadd_ps(neg, ln_lo, _mm256_fmadd_ps(neg, ln_hi, x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_fmadd_ps(p4, b, p5), u, _mm256_fmadd_ps(p6, b, p7)),
            u,
            _mm256_fmadd_ps(p8, b, one),
        );
        // j * 2^n, in f64 four lanes at a time, rounded once to f32.
        let ni = _mm256_cvtps_epi32(n); // n is a whole number: exact
        let half = |jj: __m128, nn: __m128i| {
            let pow2 = _mm256_slli_epi64::<52>(_mm256_add_epi64(_mm256_cvtepi32_epi64(nn), bias));
            _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(jj), _mm256_castsi256_pd(pow2)))
        };
        let lo = half(_mm256_castps256_ps128(j), _mm256_castsi256_si128(ni));
        let hi = half(_mm256_extractf128_ps::<1>(j), _mm256_extracti128_si256::<1>(ni));
        let y = _mm256_set_m128(hi, lo);
        // |n| > 192: 0 below, inf above, as the scalar form.
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(sign, n), limit);
        let over = _mm256_blendv_ps(_mm256_setzero_ps(), inf, _mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_setzero_ps()));
        _mm256_blendv_ps(y, over, big)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn simd_expf_shifted(_xs: &mut [f32], _sub: f32) -> usize {
    0
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn simd_expf_shifted_each(_xs: &mut [f32], _subs: &[f32]) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0];
        rms_norm_inplace(&mut x, &[1.0, 1.0], 1e-6);
        let r = (12.5f32 + 1e-6).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 4.0 / r).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0]);
    }

    #[test]
    fn shifted_expf_is_the_scalar_expf_bit_for_bit() {
        let mut xs: Vec<f32> = (0..4099).map(|i| ((i * 7919 % 4001) as f32 - 3000.0) / 9.0).collect();
        xs.extend([f32::NEG_INFINITY, -1e30, 1e30, 0.0, -0.0, 88.7, -87.3, -103.9, 200.0, -200.0, 1e-40]);
        for sub in [0.0f32, 3.5, -12.25] {
            let want: Vec<u32> = xs.iter().map(|x| expf(x - sub).to_bits()).collect();
            let mut got = xs.clone();
            expf_shifted(&mut got, sub);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "sub {sub}");
        }
        let subs: Vec<f32> = (0..xs.len()).map(|i| ((i * 31 % 97) as f32 - 48.0) / 3.0).collect();
        let want: Vec<u32> = xs.iter().zip(&subs).map(|(x, s)| expf(x - s).to_bits()).collect();
        let mut got = xs.clone();
        expf_shifted_each(&mut got, &subs);
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    }

    #[test]
    fn ggml_expf_is_accurate() {
        for i in -2000..=0 {
            let x = i as f32 / 20.0;
            let (a, b) = (expf(x), x.exp());
            assert!((a - b).abs() <= 4.0 * f32::EPSILON * b.max(f32::MIN_POSITIVE), "{x}: {a} vs {b}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(0.0), 1.0);
    }

    /// On the pool or inline, in chunks or whole, every element is the one-pass value
    /// (the ragged tail of 16-wide groups included).
    #[test]
    fn chunked_gates_equal_one_pass() {
        for n in [4 * GATE_CHUNK + 16 * 3 + 5, 37, GATE_CHUNK] {
            let g: Vec<f32> = (0..n).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 97.0).collect();
            let u: Vec<f32> = (0..n).map(|i| ((i * 31 % 101) as f32 - 50.0) / 13.0).collect();
            for (par, one) in [
                (silu_mul as fn(&mut [f32], &[f32]), silu_mul_serial as fn(&mut [f32], &[f32])),
                (gelu_mul, gelu_mul_serial),
            ] {
                let (mut a, mut b) = (g.clone(), g.clone());
                par(&mut a, &u);
                one(&mut b, &u);
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "n {n}");
            }
        }
        // The tail takes libm's exp, the groups ggml's.
        let mut t = vec![-3.0f32; 17];
        silu_mul(&mut t, &[1.0; 17]);
        assert_eq!(t[0].to_bits(), (-3.0f32 / (1.0 + expf(3.0))).to_bits());
        assert_eq!(t[16].to_bits(), (-3.0f32 / (1.0 + 3.0f32.exp())).to_bits());
    }

    #[test]
    fn gated_activations() {
        let mut g = vec![0.0, 1.0, -1.0];
        silu_mul(&mut g, &[1.0, 2.0, 1.0]);
        assert!((g[1] - 2.0 * 0.731_058_6).abs() < 1e-5 && (g[2] + 0.268_941_4).abs() < 1e-5);
        let mut h = vec![0.0, 1.0];
        gelu_mul(&mut h, &[1.0, 1.0]);
        assert_eq!(h[0], 0.0);
        assert!((h[1] - 0.841_192).abs() < 1e-3);
    }
}
