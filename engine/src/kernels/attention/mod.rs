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

mod order;
mod probs;
mod scores;
mod tile;
mod values;

use order::{LANES, Order, reduce16};
/// tinyBLAS's f32 dot (16 FMA lanes, GCC's 512-bit reduction): also the router's matmul.
pub(crate) use order::{dot_lanes, dot_vec_f32};
use tile::attend_tile;
use values::{round_probs, weigh_values};

use super::ops::expf_shifted;
use super::parallel_chunks;
use crate::kv::{BLOCK_TOKENS, SeqCache};

#[derive(Clone, Copy, Debug)]
pub struct AttnSpec<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q.k (1/sqrt(head_dim) unless the model says otherwise).
    pub scale: f32,
    /// Attend only to the last `window` positions (including the query's own).
    pub window: Option<usize>,
    /// A learned logit per query head (gpt-oss's `attn_sinks`) that takes part in every
    /// softmax's maximum and denominator and weighs no value, as ggml's `soft_max` with
    /// sinks: the maximum of the scores and the sink, then `expf(sink - max)` (libm)
    /// added to the f64 sum after the scores' chunks.
    pub sinks: Option<&'a [f32]>,
}

/// Attention for queries at positions `pos0..pos0+T` (`q` is `[T][n_heads][head_dim]`),
/// whose keys/values for those positions are already written to `cache` for `layer`.
/// Returns `[T][n_heads][head_dim]`.
pub fn attention(cache: &SeqCache, layer: usize, pos0: usize, q: &[f32], spec: &AttnSpec) -> Vec<f32> {
    let hd = spec.head_dim;
    let n_items = q.len() / hd;
    let t_len = n_items / spec.n_heads;
    let order = if super::batched(t_len) { Order::Batched } else { Order::Single };
    let work = n_items * (pos0 + t_len) * hd;
    if t_len < MIN_TILED_ROWS {
        let mut out = vec![0.0f32; q.len()];
        parallel_chunks(&mut out, hd, work, |item, o| {
            let (t, h) = (item / spec.n_heads, item % spec.n_heads);
            let qr = f16_rounded(&q[item * hd..][..hd]);
            attend_one(cache, layer, pos0 + t, h, spec, order, &qr, o);
        });
        return out;
    }
    tiled(cache, layer, pos0, q, spec, order, work)
}

/// Attention for the sequences of a batch, `parts` being `(cache, pos0, q)` as for
/// `attention`; returns their outputs stacked in order. Sequences with only a few query
/// rows (decoding ones) are done together in one parallel call whose work items are
/// (sequence, K/V head): the head's K and V rows are converted once for its whole group
/// of query heads, and a layer of a batch costs one pool barrier instead of one per
/// sequence. Each (row, head) keeps exactly `attention`'s arithmetic (`attend_tile`).
/// Sequences with many rows (prefill), and batches too small to keep every thread busy
/// that way, go through `attention` one by one.
pub fn attention_batch(parts: &[(&SeqCache, usize, &[f32])], layer: usize, spec: &AttnSpec) -> Vec<f32> {
    let (hd, n_kv) = (spec.head_dim, spec.n_kv_heads);
    let q_dim = spec.n_heads * hd;
    let rows = |q: &[f32]| q.len() / q_dim;
    let short = parts.iter().filter(|p| rows(p.2) < MIN_TILED_ROWS).count();
    if short < 2 || short * n_kv < 2 * candle_core::utils::get_num_threads() {
        // Whole rows appended (collecting through `flat_map` went value by value: 1.5 %
        // of a prefill).
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.2.len()).sum());
        for &(cache, pos0, q) in parts {
            out.extend_from_slice(&attention(cache, layer, pos0, q, spec));
        }
        return out;
    }
    grouped(parts, layer, spec)
}

/// `attention_batch`'s shared call: every short sequence's (sequence, K/V head) items
/// on the pool together, the long ones one by one.
fn grouped(parts: &[(&SeqCache, usize, &[f32])], layer: usize, spec: &AttnSpec) -> Vec<f32> {
    let (hd, n_kv) = (spec.head_dim, spec.n_kv_heads);
    let q_dim = spec.n_heads * hd;
    let group = spec.n_heads / n_kv;
    let rows = |q: &[f32]| q.len() / q_dim;
    let short: Vec<usize> = (0..parts.len()).filter(|&p| rows(parts[p].2) < MIN_TILED_ROWS).collect();
    let items: Vec<(usize, usize)> = short.iter().flat_map(|&p| (0..n_kv).map(move |g| (p, g))).collect();
    let chunk = (MIN_TILED_ROWS - 1) * group * hd;
    let work = short.iter().map(|&p| rows(parts[p].2) * (parts[p].1 + rows(parts[p].2)) * q_dim).sum();
    // Kernel choices read this thread's numerics: made here, before the pool runs.
    let orders: Vec<Order> =
        parts.iter().map(|p| if super::batched(rows(p.2)) { Order::Batched } else { Order::Single }).collect();
    let mut buf = vec![0.0f32; items.len() * chunk];
    parallel_chunks(&mut buf, chunk, work, |i, o| {
        let (p, g) = items[i];
        let (cache, pos0, q) = parts[p];
        attend_tile(cache, layer, pos0, q, spec, orders[p], g, 0..rows(q), o);
    });
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.2.len()).sum());
    let mut tiles = buf.chunks_exact(chunk);
    for &(cache, pos0, q) in parts {
        if rows(q) >= MIN_TILED_ROWS {
            out.extend(attention(cache, layer, pos0, q, spec));
            continue;
        }
        let base = out.len();
        out.resize(base + q.len(), 0.0);
        // This sequence's tiles, one per K/V head.
        for (g, tile) in tiles.by_ref().take(n_kv).enumerate() {
            place(&mut out[base..], tile, g, 0..rows(q), spec);
        }
    }
    out
}

/// Below this many query rows, one work item per (row, head) keeps both threads busy.
const MIN_TILED_ROWS: usize = 4;
/// Items (query rows x the query heads of one K/V head) a prefill tile aims at.
const TILE_ITEMS: usize = 32;

fn f16_rounded(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    f16_round_into(x, &mut out);
    out
}

/// `x` rounded to f16 and widened back, into `out` (the slice conversions: vectorized).
fn f16_round_into(x: &[f32], out: &mut [f32]) {
    let mut h = vec![f16::ZERO; x.len()];
    h.convert_from_f32_slice(x);
    h.convert_to_f32_slice(out);
}

/// Prefill: one work item is a tile of consecutive query rows times every query head
/// of one K/V head, so each K and V row is fetched and converted once per tile instead
/// of once per (row, head). Every (row, head) keeps exactly `attend_one`'s arithmetic:
/// the same dot order per key, the same softmax, the same per-lane V sums in key order.
fn tiled(
    cache: &SeqCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    spec: &AttnSpec,
    order: Order,
    work: usize,
) -> Vec<f32> {
    let hd = spec.head_dim;
    let t_len = q.len() / hd / spec.n_heads;
    let group = spec.n_heads / spec.n_kv_heads;
    let threads = candle_core::utils::get_num_threads();
    // Enough items to share each K and V row, and enough tiles for every thread.
    let rows = (TILE_ITEMS / group).min(t_len * spec.n_kv_heads / (2 * threads)).clamp(1, 8);
    let n_tt = t_len.div_ceil(rows);
    // Tiles in (kv head, row tile) order, the last rows first: they see the most keys, and
    // the pool hands tiles out in order, so the cheap ones are left for the end (the other
    // thread waited up to a grab of the dearest tiles otherwise). Each tile owns a
    // contiguous [rows][group][hd] chunk.
    let chunk = rows * group * hd;
    // Tile -> (its K/V head, its query rows).
    let tile_of = |tile: usize| {
        let tt = n_tt - 1 - tile % n_tt;
        (tile / n_tt, tt * rows..((tt + 1) * rows).min(t_len))
    };
    let mut buf = vec![0.0f32; spec.n_kv_heads * n_tt * chunk];
    parallel_chunks(&mut buf, chunk, work, |tile, o| {
        let (g, ts) = tile_of(tile);
        attend_tile(cache, layer, pos0, q, spec, order, g, ts, o);
    });
    let mut out = vec![0.0f32; q.len()];
    for (tile, part) in buf.chunks_exact(chunk).enumerate() {
        let (g, ts) = tile_of(tile);
        place(&mut out, part, g, ts, spec);
    }
    out
}

/// Copy a tile of K/V head `g` (`[rows][group][hd]` for query rows `ts`) into `out`
/// (`[T][n_heads][hd]`).
fn place(out: &mut [f32], tile: &[f32], g: usize, ts: std::ops::Range<usize>, spec: &AttnSpec) {
    let hd = spec.head_dim;
    let width = spec.n_heads / spec.n_kv_heads * hd;
    for (i, t) in ts.enumerate() {
        let at = (t * spec.n_heads) * hd + g * width;
        out[at..at + width].copy_from_slice(&tile[i * width..][..width]);
    }
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
        let s = order.dot(q, &row) * spec.scale;
        max = max.max(s);
        scores.push(s);
    }
    let inv = softmax_in_place(&mut scores, lo, max, spec.sinks.map(|s| s[head]));

    // Weighted sum of V with f16 probabilities, per output dim in ggml's lane order.
    round_probs(&mut scores, inv);
    let mut acc = vec![0.0f32; order.slots() * hd]; // [lane slot][dim]
    weigh_values(cache, layer, g, spec, order, lo..=pos, &[(lo, pos)], &scores, &mut acc);
    order.reduce_lanes(&acc, hd, out);
}

/// Scaled scores of positions `lo..` to `exp(s - max)` in place; returns 1 / their sum,
/// the sum being the f64 sum of 16-lane chunk sums, chunks aligned to absolute position 0.
fn softmax_in_place(scores: &mut [f32], lo: usize, max: f32, sink: Option<f32>) -> f32 {
    let max = sink.map_or(max, |s| sink_max(max, s));
    expf_shifted(scores, max);
    let mut sum = 0.0f64;
    // Whole chunks at a time (not element by element with a test on each); the partial
    // ones at either end copied into a zeroed chunk.
    let mut j = lo;
    loop {
        let end = ((j / LANES + 1) * LANES).min(lo + scores.len());
        let part = &scores[j - lo..end - lo];
        sum += match <&[f32; LANES]>::try_from(part) {
            Ok(whole) => reduce16(whole),
            Err(_) => {
                let mut chunk = [0.0f32; LANES];
                chunk[j % LANES..][..end - j].copy_from_slice(part);
                reduce16(&chunk)
            }
        } as f64;
        if end == lo + scores.len() {
            break;
        }
        j = end;
    }
    if let Some(s) = sink {
        sum += f64::from((s - max).exp());
    }
    (1.0 / sum) as f32
}

/// ggml's `MAX(max, sink)` of a row's score maximum and its head's sink.
fn sink_max(max: f32, sink: f32) -> f32 {
    if max > sink { max } else { sink }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod speed {
    use super::*;
    use crate::kv::KvShape;

    /// One decode step's attention over a long context, per (row, head).
    #[test]
    #[ignore = "micro-benchmark: cargo test --release -p corral-engine attend_speed -- --ignored --nocapture"]
    fn attend_speed() {
        crate::heap::keep_freed_buffers();
        // SmolLM2's attention shape at 3,500 keys, or Gemma 3's at 512 (ATTEND_SHAPE=gemma).
        let gemma = std::env::var("ATTEND_SHAPE").is_ok_and(|s| s == "gemma");
        let (hd, n_kv, n_heads, n) = if gemma { (256, 1, 4, 512) } else { (64, 3, 9, 3500) };
        let mut cache = SeqCache::new(KvShape { n_layers: 1, kv_dim: n_kv * hd });
        cache.reserve(n);
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let k: Vec<f32> = (0..n * n_kv * hd).map(f).collect();
        let v: Vec<f32> = (0..n * n_kv * hd).map(|i| f(i + 3)).collect();
        cache.write(0, 0, &k, &v);
        let spec = AttnSpec { n_heads, n_kv_heads: n_kv, head_dim: hd, scale: 0.125, window: None, sinks: None };
        let q: Vec<f32> = (0..hd).map(|i| f(i + 11)).collect();
        let mut out = vec![0.0f32; hd];
        let reps = 200;
        let t = std::time::Instant::now();
        for r in 0..reps {
            attend_one(&cache, 0, n - 1, r % n_heads, &spec, Order::Single, &q, &mut out);
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64;
        eprintln!("attend_one: {ns:.2} ns per key ({})", out[0]);
        // Prefill: a tile of 8 query rows at the end of the context, per (row, head, key).
        let (rows, group) = (8, n_heads / n_kv);
        let qt: Vec<f32> = (0..rows * n_heads * hd).map(|i| f(i + 5)).collect();
        let mut tile = vec![0.0f32; rows * group * hd];
        let reps = std::env::var("ATTEND_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
        for order in [Order::Batched, Order::Single] {
            let t = std::time::Instant::now();
            for r in 0..reps {
                attend_tile(&cache, 0, n - rows, &qt, &spec, order, r % n_kv, 0..rows, &mut tile);
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * rows * group * n) as f64;
            let name = if order == Order::Single { "one-row order" } else { "batched order" };
            eprintln!("attend_tile ({name}): {ns:.2} ns per key and (row, head) ({})", tile[0]);
        }
        // Batched decode: one row of a sequence, its heads of one K/V head, 500 keys.
        let reps = reps * 50;
        let t = std::time::Instant::now();
        for r in 0..reps {
            attend_tile(&cache, 0, 499, &qt, &spec, Order::Single, r % n_kv, 0..1, &mut tile);
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * group * 500) as f64;
        eprintln!("attend_tile (decode row, 500 keys): {ns:.2} ns per key and head ({})", tile[0]);
    }
}
