//! Causal (optionally sliding-window) multi-head attention with grouped K/V heads, read
//! directly from the paged KV cache: no per-step concatenation of K and V.
//!
//! Numerics reproduce llama.cpp's x86 AVX-512 CPU path (no flash attention) exactly:
//! a small quantized model amplifies any last-bit difference (an activation that lands
//! on the other side of a rounding boundary in the next matmul), so only the same
//! arithmetic keeps greedy output on the reference's path. That means: q, K, V and the
//! softmax probabilities in f16; scores scaled in f32; `exp` by ggml's polynomial; the
//! softmax sum over 16-lane chunks in f64; and dot products accumulated the way ggml
//! does for the batch size: 16 FMA lanes over `k` (tinyBLAS, two or more query rows) or
//! 4x16 lanes over 64-wide steps (`ggml_vec_dot_f16`, one row). Positions past the
//! query (and before a sliding window) contribute exact zeros there, so they are skipped
//! here while every visible position keeps the lane its absolute index gives it.
//!
//! One work item is one (query position, head).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::ops::expf;
use super::parallel_chunks;
use crate::kv::{BLOCK_TOKENS, SeqCache};

#[derive(Clone, Copy, Debug)]
pub struct AttnSpec {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q.k (1/sqrt(head_dim) unless the model says otherwise).
    pub scale: f32,
    /// Attend only to the last `window` positions (including the query's own).
    pub window: Option<usize>,
}

/// Which of ggml's dot-product accumulation orders applies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Two or more query rows: tinyBLAS, 16 lanes.
    Batched,
    /// One query row: `ggml_vec_dot_f16`, 4 x 16 lanes over 64-element steps.
    Single,
}

const LANES: usize = 16;

/// Attention for queries at positions `pos0..pos0+T` (`q` is `[T][n_heads][head_dim]`),
/// whose keys/values for those positions are already written to `cache` for `layer`.
/// Returns `[T][n_heads][head_dim]`.
pub fn attention(cache: &SeqCache, layer: usize, pos0: usize, q: &[f32], spec: &AttnSpec) -> Vec<f32> {
    let hd = spec.head_dim;
    let n_items = q.len() / hd;
    let t_len = n_items / spec.n_heads;
    let order = if super::batched(t_len) { Order::Batched } else { Order::Single };
    let mut out = vec![0.0f32; q.len()];
    let work = n_items * (pos0 + t_len) * hd;
    parallel_chunks(&mut out, hd, work, |item, o| {
        let (t, h) = (item / spec.n_heads, item % spec.n_heads);
        let mut qr = vec![0.0f32; hd];
        for (d, s) in qr.iter_mut().zip(&q[item * hd..][..hd]) {
            *d = f16::from_f32(*s).to_f32();
        }
        attend_one(cache, layer, pos0 + t, h, spec, order, &qr, o);
    });
    out
}

#[allow(clippy::too_many_arguments)]
fn attend_one(
    cache: &SeqCache,
    layer: usize,
    pos: usize,
    head: usize,
    spec: &AttnSpec,
    order: Order,
    q: &[f32],
    out: &mut [f32],
) {
    let hd = spec.head_dim;
    let kv_dim = spec.n_kv_heads * hd;
    let g = head / (spec.n_heads / spec.n_kv_heads);
    let lo = spec.window.map_or(0, |w| (pos + 1usize).saturating_sub(w));
    let n = pos + 1 - lo;
    let row_of = |j: usize| {
        let start = (j % BLOCK_TOKENS) * kv_dim + g * hd;
        start..start + hd
    };

    // Scores, scaled in f32 as ggml's softmax does before its max.
    let mut scores = Vec::with_capacity(n);
    let mut row = vec![0.0f32; hd];
    let mut max = f32::NEG_INFINITY;
    for j in lo..=pos {
        let (kb, _) = cache.block_kv(layer, j / BLOCK_TOKENS);
        kb[row_of(j)].convert_to_f32_slice(&mut row);
        let s = match order {
            Order::Batched => dot_lanes(q, &row),
            Order::Single => dot_vec_f16(q, &row),
        } * spec.scale;
        max = max.max(s);
        scores.push(s);
    }

    // exp and the f64 sum of 16-lane chunk sums, chunks aligned to absolute position 0.
    let mut sum = 0.0f64;
    let mut chunk = [0.0f32; LANES];
    let mut chunk_id = lo / LANES;
    for (i, s) in scores.iter_mut().enumerate() {
        let j = lo + i;
        if j / LANES != chunk_id {
            sum += reduce16(&chunk) as f64;
            chunk = [0.0; LANES];
            chunk_id = j / LANES;
        }
        *s = expf(*s - max);
        chunk[j % LANES] = *s;
    }
    sum += reduce16(&chunk) as f64;
    let inv = (1.0 / sum) as f32;

    // Weighted sum of V with f16 probabilities, per output dim in ggml's lane order.
    let groups = if order == Order::Batched { 1 } else { 4 };
    let mut acc = vec![0.0f32; groups * LANES * hd]; // [group][lane][dim]
    for (i, e) in scores.iter().enumerate() {
        let j = lo + i;
        let p = f16::from_f32(e * inv).to_f32();
        let (_, vb) = cache.block_kv(layer, j / BLOCK_TOKENS);
        vb[row_of(j)].convert_to_f32_slice(&mut row);
        let slot = match order {
            Order::Batched => j % LANES,
            Order::Single => (j % 64) / LANES * LANES + j % LANES,
        };
        for (a, v) in acc[slot * hd..][..hd].iter_mut().zip(&row) {
            *a = v.mul_add(p, *a);
        }
    }
    for (d, o) in out.iter_mut().enumerate() {
        let lane = |grp: usize, l: usize| acc[(grp * LANES + l) * hd + d];
        let mut x = [0.0f32; LANES];
        for (l, xl) in x.iter_mut().enumerate() {
            *xl = match order {
                Order::Batched => lane(0, l),
                Order::Single => (lane(0, l) + lane(2, l)) + (lane(1, l) + lane(3, l)),
            };
        }
        *o = reduce16(&x);
    }
}

/// GCC's `_mm512_reduce_add_ps`: halves, then quarters, then pairs.
#[inline]
fn reduce16(a: &[f32; LANES]) -> f32 {
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
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16` order (AVX-512): four 16-lane accumulators over 64-element steps,
/// combined (0+2), (1+3), then together; any tail summed in f64.
#[inline]
fn dot_vec_f16(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !63;
    let mut acc = [[0.0f32; LANES]; 4];
    for (ca, cb) in a[..np].chunks_exact(64).zip(b[..np].chunks_exact(64)) {
        for (grp, accg) in acc.iter_mut().enumerate() {
            for l in 0..LANES {
                let i = grp * LANES + l;
                accg[l] = ca[i].mul_add(cb[i], accg[l]);
            }
        }
    }
    let mut x = [0.0f32; LANES];
    for l in 0..LANES {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut sum = reduce16(&x) as f64;
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvShape;

    /// Reference: plain softmax(q.K^T * scale) V over the visible positions.
    fn naive(keys: &[Vec<f32>], vals: &[Vec<f32>], q: &[f32], pos: usize, lo: usize, scale: f32) -> Vec<f32> {
        let s: Vec<f32> = (lo..=pos).map(|j| dot_lanes(q, &keys[j]) * scale).collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
        let mut out = vec![0.0; q.len()];
        for (w, j) in e.iter().zip(lo..=pos) {
            for (o, v) in out.iter_mut().zip(&vals[j]) {
                *o += w / z * v;
            }
        }
        out
    }

    #[test]
    fn matches_naive_softmax_with_gqa_and_window() {
        let (hd, n_kv, n_heads, n) = (64, 2, 4, 75);
        let shape = KvShape { n_layers: 1, kv_dim: n_kv * hd };
        let mut cache = SeqCache::new(shape);
        cache.reserve(n);
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let k: Vec<f32> = (0..n * n_kv * hd).map(f).collect();
        let v: Vec<f32> = (0..n * n_kv * hd).map(|i| f(i + 13)).collect();
        cache.write(0, 0, &k, &v);
        let r16 = |x: &f32| f16::from_f32(*x).to_f32();
        for window in [None, Some(20usize)] {
            for t_len in [1, 3] {
                let spec = AttnSpec { n_heads, n_kv_heads: n_kv, head_dim: hd, scale: 0.1, window };
                let pos0 = n - t_len;
                let q: Vec<f32> = (0..t_len * n_heads * hd).map(|i| f(i + 101)).collect();
                let out = attention(&cache, 0, pos0, &q, &spec);
                for t in 0..t_len {
                    for h in 0..n_heads {
                        let g = h / 2;
                        let row = |src: &[f32], j: usize| src[(j * n_kv + g) * hd..][..hd].iter().map(r16).collect();
                        let keys: Vec<Vec<f32>> = (0..n).map(|j| row(&k, j)).collect();
                        let vals: Vec<Vec<f32>> = (0..n).map(|j| row(&v, j)).collect();
                        let pos = pos0 + t;
                        let lo = window.map_or(0, |w| (pos + 1usize).saturating_sub(w));
                        let qi: Vec<f32> = q[(t * n_heads + h) * hd..][..hd].iter().map(r16).collect();
                        let want = naive(&keys, &vals, &qi, pos, lo, 0.1);
                        let got = &out[(t * n_heads + h) * hd..][..hd];
                        for (a, b) in want.iter().zip(got) {
                            assert!((a - b).abs() < 2e-3, "t={t} h={h} window={window:?}: {a} vs {b}");
                        }
                    }
                }
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
