//! The attention kernels against a plain softmax, and their paths (one item, tiles, a
//! batch's grouped decode rows) against each other, bit for bit; with sinks too.

use super::order::dot_lanes;
use super::*;
use crate::kv::KvShape;

/// Reference: plain softmax(q.K^T * scale) V over the visible positions, with a sink
/// logit in the denominator if given.
fn naive(
    keys: &[Vec<f32>],
    vals: &[Vec<f32>],
    q: &[f32],
    (pos, lo): (usize, usize),
    scale: f32,
    sink: Option<f32>,
) -> Vec<f32> {
    let s: Vec<f32> = (lo..=pos).map(|j| dot_lanes(q, &keys[j]) * scale).collect();
    let m = s.iter().cloned().chain(sink).fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - m).exp());
    let mut out = vec![0.0; q.len()];
    for (w, j) in e.iter().zip(lo..=pos) {
        for (o, v) in out.iter_mut().zip(&vals[j]) {
            *o += w / z * v;
        }
    }
    out
}

/// A one-layer cache of `n` positions with K = f(i), V = f(i + v_shift).
fn filled_cache(n: usize, kv_dim: usize, f: impl Fn(usize) -> f32, v_shift: usize) -> (SeqCache, Vec<f32>, Vec<f32>) {
    let mut cache = SeqCache::new(KvShape { n_layers: 1, kv_dim });
    cache.reserve(n);
    let k: Vec<f32> = (0..n * kv_dim).map(&f).collect();
    let v: Vec<f32> = (0..n * kv_dim).map(|i| f(i + v_shift)).collect();
    cache.write(0, 0, &k, &v);
    (cache, k, v)
}

/// Sink logits per head: one well above the scores (most weight on no value), one
/// below, the others near them.
const SINKS: [f32; 6] = [3.0, -2.0, 0.25, 0.5, -0.125, 1.0];

#[test]
fn matches_naive_softmax_with_gqa_and_window() {
    let (hd, n_kv, n_heads, n) = (64, 2, 4, 75);
    let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
    let (cache, k, v) = filled_cache(n, n_kv * hd, f, 13);
    let r16 = |x: &f32| f16::from_f32(*x).to_f32();
    for (window, sinks) in [None, Some(20usize)].into_iter().flat_map(|w| [(w, None), (w, Some(&SINKS[..4]))]) {
        for t_len in [1, 3] {
            let spec = AttnSpec { n_heads, n_kv_heads: n_kv, head_dim: hd, scale: 0.1, window, sinks };
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
                    let want = naive(&keys, &vals, &qi, (pos, lo), 0.1, sinks.map(|s| s[h]));
                    let got = &out[(t * n_heads + h) * hd..][..hd];
                    for (a, b) in want.iter().zip(got) {
                        assert!((a - b).abs() < 2e-3, "t={t} h={h} window={window:?} sinks {sinks:?}: {a} vs {b}");
                    }
                }
            }
        }
    }
}

/// The chunk sums are over 16-lane chunks aligned to absolute position 0, with
/// zeros where a chunk has no visible position.
#[test]
fn softmax_sums_position_aligned_chunks() {
    for (lo, n) in [(0, 1), (0, 16), (5, 3), (13, 40), (16, 16), (31, 1), (7, 100)] {
        let xs: Vec<f32> = (0..n).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 7.0).collect();
        let max = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut got = xs.clone();
        let inv = softmax_in_place(&mut got, lo, max, None);
        let mut e = xs.clone();
        expf_shifted(&mut e, max);
        assert_eq!(got, e);
        let mut sum = 0.0f64;
        for c in lo / LANES..=(lo + n - 1) / LANES {
            let chunk: [f32; LANES] = std::array::from_fn(|l| {
                let j = c * LANES + l;
                if j >= lo && j < lo + n { e[j - lo] } else { 0.0 }
            });
            sum += reduce16(&chunk) as f64;
        }
        assert_eq!(inv.to_bits(), ((1.0 / sum) as f32).to_bits(), "lo {lo} n {n}");
    }
}

/// A sink raises the maximum when above it, and joins the f64 sum after the chunks as
/// libm's `expf(sink - max)`.
#[test]
fn a_sink_takes_part_in_the_maximum_and_the_sum() {
    let xs: Vec<f32> = (0..37).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 9.0).collect();
    let max = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    for sink in [max + 1.5, max - 3.0] {
        let top = max.max(sink);
        let mut plain = xs.clone();
        let inv_plain = softmax_in_place(&mut plain, 5, top, None);
        let mut got = xs.clone();
        let inv = softmax_in_place(&mut got, 5, max, Some(sink));
        assert_eq!(got, plain, "exps against the larger of the two");
        let want = 1.0 / (1.0 / f64::from(inv_plain) + f64::from((sink - top).exp()));
        assert!((f64::from(inv) - want).abs() <= want * 1e-6, "sink {sink}: {inv} vs {want}");
    }
}

/// The tiled prefill path is bit-identical to one (row, head) at a time, in both
/// orders, with and without a window, for tiles that end mid-way.
#[test]
fn tiles_compute_exactly_what_single_items_compute() {
    for hd in [64, 128, 256, 80] {
        tiles_equal_items(hd, &[Order::Single, Order::Batched]);
    }
    // A head size that is not a multiple of 16 (the V sums' last dims one at a time);
    // the batched order's dot needs multiples of 16.
    tiles_equal_items(72, &[Order::Single]);
}

fn tiles_equal_items(hd: usize, orders: &[Order]) {
    let (n_kv, n_heads, n) = (2, 6, 150);
    let f = |i: usize| ((i * 7919 % 1000) as f32 / 300.0) - 1.6;
    let (cache, _, _) = filled_cache(n, n_kv * hd, f, 29);
    for &order in orders {
        for (window, sinks) in [None, Some(37usize)].into_iter().flat_map(|w| [(w, None), (w, Some(&SINKS[..]))]) {
            let spec = AttnSpec { n_heads, n_kv_heads: n_kv, head_dim: hd, scale: 0.125, window, sinks };
            let (pos0, t_len) = (n - 43, 43);
            let q: Vec<f32> = (0..t_len * n_heads * hd).map(|i| f(i + 7)).collect();
            let got = tiled(&cache, 0, pos0, &q, &spec, order, 0);
            for item in 0..t_len * n_heads {
                let (t, h) = (item / n_heads, item % n_heads);
                let mut want = vec![0.0f32; hd];
                attend_one(&cache, 0, pos0 + t, h, &spec, order, &f16_rounded(&q[item * hd..][..hd]), &mut want);
                let same = want.iter().zip(&got[item * hd..][..hd]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "hd {hd} row {t} head {h} window {window:?} sinks {}", sinks.is_some());
            }
        }
    }
}

/// A batch's attention equals each sequence's own, bit for bit: decoding rows
/// (grouped per K/V head in one call) and a prefill among them.
#[test]
fn batch_attention_equals_each_sequence_alone() {
    let (hd, n_kv, n_heads) = (64, 2, 6);
    let caches: Vec<(SeqCache, usize, usize)> = [(40, 1), (75, 1), (33, 2), (90, 5), (12, 1), (61, 3), (8, 1)]
        .iter()
        .enumerate()
        .map(|(s, &(n, t_len))| {
            let f = move |i: usize| ((i * 7919 + s * 131) % 1000) as f32 / 400.0 - 1.2;
            (filled_cache(n, n_kv * hd, f, 17).0, n - t_len, t_len)
        })
        .collect();
    let qs: Vec<Vec<f32>> = caches
        .iter()
        .enumerate()
        .map(|(s, c)| (0..c.2 * n_heads * hd).map(|i| ((i * 31 + s) % 97) as f32 / 50.0 - 1.0).collect())
        .collect();
    for (window, sinks) in [None, Some(20usize)].into_iter().flat_map(|w| [(w, None), (w, Some(&SINKS[..]))]) {
        let spec = AttnSpec { n_heads, n_kv_heads: n_kv, head_dim: hd, scale: 0.125, window, sinks };
        let parts: Vec<(&SeqCache, usize, &[f32])> =
            caches.iter().zip(&qs).map(|(c, q)| (&c.0, c.1, q.as_slice())).collect();
        let got = grouped(&parts, 0, &spec);
        assert_eq!(attention_batch(&parts, 0, &spec), got);
        let want: Vec<f32> = parts.iter().flat_map(|&(c, pos0, q)| attention(c, 0, pos0, q, &spec)).collect();
        assert_eq!(got.len(), want.len());
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "window {window:?} sinks {}", sinks.is_some());
    }
}
