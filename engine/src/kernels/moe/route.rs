//! A token's routing, as llama.cpp's `build_moe_ffn` decides it for qwen3moe (softmax
//! gating, weights renormalized: `route`) and gpt-oss (the top logits, then a softmax of
//! those alone: `route_softmax_weight`): pure functions of the router's logits, in ggml's
//! CPU arithmetic (its AVX-512 build, which the rest of the engine reproduces).
//!
//! - `softmax`: `ggml_soft_max` of the row — the maximum, then `exp(x - max)` through
//!   ggml's vector `expf` sixteen lanes at a time, each chunk's sum reduced as
//!   `_mm512_reduce_add_ps` does and added in f64, a tail past the last whole chunk
//!   through libm's `expf` added one by one in f64; every value times `(f32)(1 / sum)`.
//! - `top_k`: `ggml_top_k` — `std::partial_sort` by probability, largest first, then
//!   the first two swapped ("the order is not important", ggml says; but the experts'
//!   outputs are summed in this order, so it is kept). Equal probabilities go by the
//!   lower index first (libstdc++'s heap may order them otherwise; with f32 softmax
//!   outputs of a real router that does not happen in practice).
//! - `weights`: the chosen probabilities (`get_rows`), divided by their sum, the sum in
//!   f64 in the chosen order (`ggml_sum_rows`), rounded to f32 once.

use crate::kernels::ops::expf_shifted;

const LANES: usize = 16;

/// GCC's `_mm512_reduce_add_ps`: halves, then quarters, then pairs.
fn reduce16(a: &[f32]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6 = [t3[4] + t3[0], t3[5] + t3[1], t3[6] + t3[2], t3[7] + t3[3]];
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// `ggml_soft_max` of one row of router logits (see the module's notes).
pub(crate) fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| if m > x { m } else { x });
    let mut p = logits.to_vec();
    let whole = p.len() / LANES * LANES;
    expf_shifted(&mut p[..whole], max);
    let mut sum = 0.0f64;
    for chunk in p[..whole].chunks_exact(LANES) {
        sum += f64::from(reduce16(chunk));
    }
    for x in &mut p[whole..] {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let inv = (1.0 / sum) as f32;
    for x in &mut p {
        *x *= inv;
    }
    p
}

/// `ggml_top_k` of the probabilities: the `k` largest, in llama.cpp's order.
pub(crate) fn top_k(p: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx.truncate(k);
    if idx.len() > 1 {
        idx.swap(0, 1);
    }
    idx
}

/// The chosen experts' probabilities, renormalized to sum to one (`norm_w`).
pub(crate) fn weights(p: &[f32], chosen: &[usize]) -> Vec<f32> {
    let sum = chosen.iter().map(|&e| f64::from(p[e])).sum::<f64>() as f32;
    chosen.iter().map(|&e| p[e] / sum).collect()
}

/// gpt-oss's route (`SOFTMAX_WEIGHT` gating): the `k` largest logits (ggml's
/// `argsort_top_k`, largest first), their weights `ggml_soft_max` of those `k` logits
/// alone, in that order. (`top_k`'s swap of the first two would change nothing here: a
/// softmax of a few f32 values sums them exactly in f64, and the first two outputs are
/// the first two terms of the weighted sum.)
pub(crate) fn route_softmax_weight(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut chosen: Vec<usize> = (0..logits.len()).collect();
    chosen.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    chosen.truncate(k);
    let w = softmax(&chosen.iter().map(|&e| logits[e]).collect::<Vec<_>>());
    chosen.into_iter().zip(w).collect()
}

/// A token's experts and their weights, in the order their outputs are summed.
pub(crate) fn route(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let p = softmax(logits);
    let chosen = top_k(&p, k);
    let w = weights(&p, &chosen);
    chosen.into_iter().zip(w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_of_a_short_row_is_libms_exp_over_an_f64_sum() {
        let logits = [0.5f32, -1.25, 2.0, 0.0, 1.5];
        let e: Vec<f32> = logits.iter().map(|&x| (x - 2.0f32).exp()).collect();
        let sum: f64 = e.iter().map(|&x| f64::from(x)).sum();
        let inv = (1.0 / sum) as f32;
        let want: Vec<f32> = e.iter().map(|&x| x * inv).collect();
        assert_eq!(softmax(&logits), want);
        assert_eq!(softmax(&[3.0]), vec![1.0]);
    }

    #[test]
    fn softmax_of_sixteen_takes_ggmls_vector_exp_and_the_512_bit_reduction() {
        let logits: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut e: Vec<f32> = logits[..16].iter().map(|&x| crate::kernels::ops::expf(x - max)).collect();
        let mut sum = f64::from(reduce16(&e));
        for &x in &logits[16..] {
            let v = (x - max).exp();
            e.push(v);
            sum += f64::from(v);
        }
        let inv = (1.0 / sum) as f32;
        let want: Vec<f32> = e.iter().map(|&x| x * inv).collect();
        assert_eq!(softmax(&logits), want);
        let total: f32 = want.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
    }

    #[test]
    fn reduce16_is_halves_then_quarters_then_pairs() {
        let a: Vec<f32> = (0..16).map(|i| [1e8, 1.0, -1e8, 3.5][i % 4] * (i + 1) as f32).collect();
        let h: Vec<f32> = (0..8).map(|i| a[i + 8] + a[i]).collect();
        let q = [h[4] + h[0], h[5] + h[1], h[6] + h[2], h[7] + h[3]];
        assert_eq!(reduce16(&a).to_bits(), ((q[0] + q[2]) + (q[1] + q[3])).to_bits());
    }

    #[test]
    fn top_k_is_largest_first_with_the_first_two_swapped() {
        let p = [0.1f32, 0.4, 0.05, 0.3, 0.15];
        assert_eq!(top_k(&p, 3), vec![3, 1, 4]);
        assert_eq!(top_k(&p, 1), vec![1]);
        assert_eq!(top_k(&p, 2), vec![3, 1]);
        // Ties go by the lower index first (before the swap).
        assert_eq!(top_k(&[0.25, 0.25, 0.5, 0.0], 3), vec![0, 2, 1]);
    }

    #[test]
    fn gpt_oss_weights_are_a_softmax_of_the_top_logits_alone() {
        let logits = [0.5f32, -1.0, 2.0, 1.5, 0.25, 3.0];
        let r = route_softmax_weight(&logits, 3);
        assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), vec![5, 2, 3]);
        // libm's expf of each less the maximum, over their f64 sum.
        let e = [0.0f32.exp(), (-1.0f32).exp(), (-1.5f32).exp()];
        let inv = (1.0 / e.iter().map(|&x| f64::from(x)).sum::<f64>()) as f32;
        assert_eq!(r.iter().map(|&(_, w)| w).collect::<Vec<_>>(), e.map(|x| x * inv).to_vec());
        assert_eq!(route_softmax_weight(&logits, 1), vec![(5, 1.0)]);
    }

    #[test]
    fn weights_are_renormalized_by_their_f64_sum_rounded_once() {
        let p = [0.1f32, 0.4, 0.05, 0.3, 0.15];
        let w = weights(&p, &[3, 1]);
        let sum = (0.3f64 as f32 as f64 + 0.4f32 as f64) as f32;
        assert_eq!(w, vec![0.3 / sum, 0.4 / sum]);
        let r = route(&[0.0, 2.0, -1.0, 1.0], 2);
        assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), vec![3, 1]);
        assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-6);
        assert!(r[1].1 > r[0].1);
    }
}
