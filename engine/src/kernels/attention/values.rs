//! The probability-weighted V sums of attention, in ggml's lane order (`super::order`).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::AttnSpec;
use super::order::Order;
use crate::kv::{BLOCK_TOKENS, SeqCache};

/// `exp(s - max)` values to the probabilities ggml's V sum takes: times 1/sum, rounded
/// to f16.
pub(super) fn round_probs(probs: &mut [f32], inv: f32) {
    let done = simd_round(probs, Scale::One(inv));
    for p in &mut probs[done..] {
        *p = f16::from_f32(*p * inv).to_f32();
    }
}

/// `round_probs` with a factor per element: `probs[i]` times `invs[i]`.
pub(super) fn round_probs_each(probs: &mut [f32], invs: &[f32]) {
    let done = simd_round(probs, Scale::Each(invs));
    for (p, inv) in probs[done..].iter_mut().zip(&invs[done..]) {
        *p = f16::from_f32(*p * inv).to_f32();
    }
}

/// The factor(s) of `simd_round`.
#[derive(Clone, Copy)]
enum Scale<'a> {
    One(f32),
    Each(&'a [f32]),
}

/// The vector part of `round_probs` and `round_probs_each` (F16C rounds to nearest
/// even, as `f16::from_f32`); returns how many leading elements it did.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "f16c"))]
fn simd_round(probs: &mut [f32], scale: Scale<'_>) -> usize {
    use std::arch::x86_64::*;
    let len = match scale {
        Scale::One(_) => probs.len(),
        Scale::Each(invs) => probs.len().min(invs.len()),
    };
    let n8 = len / 8 * 8;
    // SAFETY: AVX2 and F16C are target features of this build; each load and store
    // touches the 8 floats at `i < n8 <= len` of `probs` or `invs`.
    unsafe {
        for i in (0..n8).step_by(8) {
            let inv = match scale {
                Scale::One(inv) => _mm256_set1_ps(inv),
                Scale::Each(invs) => _mm256_loadu_ps(invs.as_ptr().add(i)),
            };
            let p = probs.as_mut_ptr().add(i);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(_mm256_loadu_ps(p), inv));
            _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
        }
    }
    n8
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "f16c")))]
fn simd_round(_: &mut [f32], _: Scale<'_>) -> usize {
    0
}

/// Bytes of V rows converted to f32 at a time: they stay in L2 (1 MiB on Zen 4, 2 MiB
/// on Sapphire Rapids) while every item's slots pass over them. Each slot's register
/// run covers only the chunk's keys of that slot: at 64 KiB, Gemma 3's 256-wide heads
/// in the one-row order (64 slots) got one key per run, all load and store; at 256 KiB,
/// four (Gemma 3 pp512 +4 %, SmolLM2 unchanged; 12-04).
const CHUNK_BYTES: usize = 256 << 10;

/// Keys per chunk: a whole number of slot rounds.
fn chunk_keys(lanes: usize, hd: usize) -> usize {
    (CHUNK_BYTES / (hd * 4)).max(lanes) / lanes * lanes
}
/// Output dims whose accumulators are held in registers at a time.
const DIMS: usize = 64;

/// The probability-weighted V sums of K/V head `g` over keys `keys` for each item
/// `(lo, pos)` (its visible keys), into `acc` (`[item][slot][dim]`, zeroed). `probs` is
/// `[item][key - keys.start]`. Each slot's accumulator is an FMA chain over its keys in
/// ascending order — ggml's order — so the slots can be done one after another: a
/// slot's 64 accumulators stay in registers over its keys instead of being loaded and
/// stored at every key (which bound this loop on stores). V rows are converted once per
/// chunk of keys, for every item.
#[allow(clippy::too_many_arguments)]
pub(super) fn weigh_values(
    cache: &SeqCache,
    layer: usize,
    g: usize,
    spec: &AttnSpec,
    order: Order,
    keys: std::ops::RangeInclusive<usize>,
    items: &[(usize, usize)],
    probs: &[f32],
    acc: &mut [f32],
) {
    let (hd, lanes) = (spec.head_dim, order.slots());
    let (jlo, jhi) = (*keys.start(), *keys.end());
    let chunk = chunk_keys(lanes, spec.head_dim);
    VROWS.with_borrow_mut(|vrows| {
        let need = chunk.min(jhi + 1 - jlo) * hd;
        if vrows.len() < need {
            vrows.resize(need, 0.0);
        }
        weigh_chunks(cache, layer, g, spec, order, (jlo, jhi), items, probs, acc, vrows);
    });
}

thread_local! {
    /// `weigh_values`' converted V rows, kept per thread: a fresh zeroed buffer per call
    /// cost more than the sums themselves in decode (one call per head and layer).
    static VROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `weigh_values` with its scratch buffer.
#[allow(clippy::too_many_arguments)]
fn weigh_chunks(
    cache: &SeqCache,
    layer: usize,
    g: usize,
    spec: &AttnSpec,
    order: Order,
    (jlo, jhi): (usize, usize),
    items: &[(usize, usize)],
    probs: &[f32],
    acc: &mut [f32],
    vrows: &mut [f32],
) {
    let hd = spec.head_dim;
    let kv_dim = spec.n_kv_heads * hd;
    let lanes = order.slots();
    let span = jhi + 1 - jlo;
    let chunk = chunk_keys(lanes, spec.head_dim);
    // Chunks aligned to the slots (absolute positions), so each starts at slot 0.
    let mut c0 = jlo / lanes * lanes;
    while c0 <= jhi {
        let (a, b) = (c0.max(jlo), (c0 + chunk - 1).min(jhi));
        for j in a..=b {
            let (_, vb) = cache.block_kv(layer, j / BLOCK_TOKENS);
            let start = (j % BLOCK_TOKENS) * kv_dim + g * hd;
            vb[start..start + hd].convert_to_f32_slice(&mut vrows[(j - a) * hd..][..hd]);
        }
        for (i, &(lo, pos)) in items.iter().enumerate() {
            let (from, to) = (a.max(lo), b.min(pos));
            if from > to {
                continue;
            }
            let p = &probs[i * span..];
            for slot in 0..lanes {
                // The first key of this slot at or after `from`.
                let first = from + (slot + lanes - from % lanes) % lanes;
                if first > to {
                    continue;
                }
                let out = &mut acc[(i * lanes + slot) * hd..][..hd];
                let keys = (first..=to).step_by(lanes).map(|j| (p[j - jlo], &vrows[(j - a) * hd..][..hd]));
                fma_rows(out, keys);
            }
        }
        c0 += chunk;
    }
}

/// `out[d] = fma(v[d], p, out[d])` for each `(p, v)` in order, 64 dims at a time.
#[inline]
fn fma_rows<'a>(out: &mut [f32], rows: impl Iterator<Item = (f32, &'a [f32])> + Clone) {
    let mut d0 = 0;
    while d0 + DIMS <= out.len() {
        let mut a: [f32; DIMS] = out[d0..d0 + DIMS].try_into().expect("64 dims");
        for (p, v) in rows.clone() {
            let v: &[f32; DIMS] = v[d0..d0 + DIMS].try_into().expect("64 dims");
            for d in 0..DIMS {
                a[d] = v[d].mul_add(p, a[d]);
            }
        }
        out[d0..d0 + DIMS].copy_from_slice(&a);
        d0 += DIMS;
    }
    if d0 < out.len() {
        for (p, v) in rows {
            for (o, x) in out[d0..].iter_mut().zip(&v[d0..]) {
                *o = x.mul_add(p, *o);
            }
        }
    }
}
