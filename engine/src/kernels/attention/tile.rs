//! A tile of attention: several (query row, head) items that share one K/V head, done
//! together so each K and V row is fetched and converted once for all of them.
//!
//! Each item keeps exactly `attend_one`'s arithmetic; only the loops are reordered:
//! - scores: eight keys at a time, each key's 16 lane sums in two vectors as in
//!   `Order::dot`, the eight lane reductions done side by side with the same additions
//!   (`lanes8`);
//! - V sums: a register tile of up to four items × 16 dims runs each slot's FMA chain
//!   over that slot's keys in ascending order (`slot_sums`), with probabilities laid out
//!   key-major so one key's probabilities for the tile's items are adjacent. An item
//!   takes probability 0 at keys it does not see (past its row, before its window),
//!   which leaves every accumulator unchanged — as in ggml, whose V product runs over
//!   every cached key with the masked ones at 0.

use half::f16;

use super::order::{LANES, Order, reduce16_lanes};
use super::probs::{SlotMajor, tile_probs};
use super::scores::score_keys;
use super::{AttnSpec, f16_round_into};
use crate::kv::{BLOCK_TOKENS, SeqCache};

/// Output dims a V register tile covers.
const DIMS: usize = 16;
/// Items a V register tile covers.
const ITEMS: usize = 4;
/// Items a V register tile covers with 512-bit vectors (16 dims in one register).
const WIDE_ITEMS: usize = 8;

/// The tile of K/V head `g` for query rows `ts` (queries `q`, `[T][n_heads][hd]`, at
/// positions from `pos0`) into `out` (`[rows][group][hd]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_tile(
    cache: &SeqCache,
    layer: usize,
    pos0: usize,
    q: &[f32],
    spec: &AttnSpec,
    order: Order,
    g: usize,
    ts: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let hd = spec.head_dim;
    let group = spec.n_heads / spec.n_kv_heads;
    // Items: (first visible key, last visible key) per (row, head in group), row-major,
    // matching `out`'s [rows][group][hd].
    let items: Vec<(usize, usize)> = ts
        .clone()
        .flat_map(|t| {
            let pos = pos0 + t;
            (0..group).map(move |_| (spec.window.map_or(0, |w| (pos + 1usize).saturating_sub(w)), pos))
        })
        .collect();
    let mut qs = vec![0.0f32; items.len() * hd];
    for (i, t) in ts.clone().enumerate() {
        // The row's query heads of this group are adjacent in `q`.
        let at = (t * spec.n_heads + g * group) * hd;
        f16_round_into(&q[at..][..group * hd], &mut qs[i * group * hd..][..group * hd]);
    }
    let jlo = items.iter().map(|r| r.0).min().unwrap_or(0);
    let jhi = items.iter().map(|r| r.1).max().unwrap_or(0);
    let rows = KvRows::new(cache, layer, g, spec, jlo..=jhi);

    // Scores, then probabilities in place, key-major in slot order: `[entry][item]`.
    let slots = SlotMajor::new(order, jlo..=jhi);
    let n = items.len();
    let mut probs = vec![f32::NEG_INFINITY; slots.len() * n];
    score_keys(&rows, order, &qs, &items, spec.scale, &slots, &mut probs);
    // Each item's head's sink: items are (row, head of the group), row-major.
    let sinks: Option<Vec<f32>> = spec.sinks.map(|s| (0..n).map(|i| s[g * group + i % group]).collect());
    tile_probs(&mut probs, n, &slots, sinks.as_deref());
    let mut scratch = SCRATCH.take();
    let vals = sized(&mut scratch.vals, slots.len() * hd);
    for j in jlo..=jhi {
        // In 16-byte pieces: a copy of a length known only at run time is a `memmove`
        // call per key (7 % of batched decode).
        let dst = vals[slots.at(j) * hd..][..hd].chunks_exact_mut(8);
        for (d, s) in dst.zip(rows.v(j).chunks_exact(8)) {
            d.copy_from_slice(s);
        }
        if !hd.is_multiple_of(8) {
            let t = hd / 8 * 8;
            vals[slots.at(j) * hd + t..][..hd - t].copy_from_slice(&rows.v(j)[t..]);
        }
    }
    weigh_tile(&slots, order, vals, hd, &probs, n, (&mut scratch.sums, &mut scratch.lanes), out);
    SCRATCH.set(scratch);
}

/// A thread's buffers for its tiles (V rows, slot sums, lane sums), reused from tile to
/// tile without zeroing: a tile reads only elements it has written (entries outside a
/// slot's `entries` are never read), and zeroing them cost more than filling them.
#[derive(Default)]
struct Scratch {
    vals: Vec<f16>,
    sums: Vec<f32>,
    lanes: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// The first `n` elements of `v`, grown if need be (old contents left as they are).
fn sized<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// One K/V head's rows of one layer over keys `keys`, by absolute position.
pub(super) struct KvRows<'a> {
    /// `(K plane, V plane)` of each block from the first key's.
    blocks: Vec<(&'a [f16], &'a [f16])>,
    /// Offset of the head's row within a position's `kv_dim` floats, and `kv_dim`.
    off: usize,
    kv_dim: usize,
    pub(super) hd: usize,
    pub(super) jlo: usize,
    pub(super) jhi: usize,
}

impl<'a> KvRows<'a> {
    fn new(
        cache: &'a SeqCache,
        layer: usize,
        g: usize,
        spec: &AttnSpec,
        keys: std::ops::RangeInclusive<usize>,
    ) -> Self {
        let (jlo, jhi) = (*keys.start(), *keys.end());
        let blocks = (jlo / BLOCK_TOKENS..=jhi / BLOCK_TOKENS).map(|b| cache.block_kv(layer, b)).collect();
        let hd = spec.head_dim;
        KvRows { blocks, off: g * hd, kv_dim: spec.n_kv_heads * hd, hd, jlo, jhi }
    }

    fn at(&self, j: usize) -> (usize, usize) {
        (j / BLOCK_TOKENS - self.jlo / BLOCK_TOKENS, (j % BLOCK_TOKENS) * self.kv_dim + self.off)
    }

    pub(super) fn k(&self, j: usize) -> &'a [f16] {
        let (b, s) = self.at(j);
        &self.blocks[b].0[s..s + self.hd]
    }

    fn v(&self, j: usize) -> &'a [f16] {
        let (b, s) = self.at(j);
        &self.blocks[b].1[s..s + self.hd]
    }
}

/// The V sums of every item (`probs`: `[entry][item]`, `n` items; `vals`: `[entry][hd]`)
/// into `out` (`[item][hd]`): each slot's chains in ascending key order, the slots
/// combined per lane in `order`'s way as soon as a lane's slots are done, then the lanes
/// reduced.
#[allow(clippy::too_many_arguments)]
fn weigh_tile(
    slots: &SlotMajor,
    order: Order,
    vals: &[f16],
    hd: usize,
    probs: &[f32],
    n: usize,
    (sums, lanes): (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) {
    let groups = slots.slots / LANES;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    let wide = super::scores::avx512();
    let sums = sized(sums, groups * n * hd); // [group][item][dim]
    let lanes = sized(lanes, n * LANES * hd); // [item][lane][dim]
    for l in 0..LANES {
        for gr in 0..groups {
            let e = slots.entries(gr * LANES + l);
            let (v, p) = (&vals[e.start * hd..e.end * hd], &probs[e.start * n..e.end * n]);
            let s = &mut sums[gr * n * hd..][..n * hd];
            for d0 in (0..hd).step_by(DIMS) {
                let mut i0 = 0;
                #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
                if hd - d0 >= DIMS && wide {
                    while i0 + WIDE_ITEMS <= n {
                        // SAFETY: the CPU has AVX-512 F (`avx512`).
                        unsafe { slot_sums_512(v, p, hd, d0, n, i0, &mut s[i0 * hd + d0..]) };
                        i0 += WIDE_ITEMS;
                    }
                }
                while i0 < n {
                    let at = &mut s[i0 * hd + d0..];
                    match (hd - d0 >= DIMS, ITEMS.min(n - i0)) {
                        (true, 4) => slot_sums::<4>(v, p, hd, d0, n, i0, at),
                        (true, 3) => slot_sums::<3>(v, p, hd, d0, n, i0, at),
                        (true, 2) => slot_sums::<2>(v, p, hd, d0, n, i0, at),
                        (true, _) => slot_sums::<1>(v, p, hd, d0, n, i0, at),
                        (false, ni) => slot_sums_scalar(v, p, hd, d0..hd, n, i0..i0 + ni, at),
                    }
                    i0 += ITEMS;
                }
            }
        }
        for i in 0..n {
            let x = &mut lanes[(i * LANES + l) * hd..][..hd];
            let s = |gr: usize| &sums[(gr * n + i) * hd..][..hd];
            match order {
                Order::Batched => x.copy_from_slice(s(0)),
                Order::Single => {
                    let (a, b, c, d) = (s(0), s(1), s(2), s(3));
                    for (k, x) in x.iter_mut().enumerate() {
                        *x = (a[k] + c[k]) + (b[k] + d[k]);
                    }
                }
            }
        }
    }
    for (i, o) in out.chunks_exact_mut(hd).take(n).enumerate() {
        reduce16_lanes(&mut lanes[i * LANES * hd..][..LANES * hd], hd, o);
    }
}

/// One slot's FMA chains over its entries (`v`: `[k][hd]`, `p`: `[k][n]`) for `NB` items
/// from `i0` and dims `d0..d0 + 16`: item `i0 + i`'s sums go to `out[i * hd..][..16]`.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
fn slot_sums<const NB: usize>(v: &[f16], p: &[f32], hd: usize, d0: usize, n: usize, i0: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let nk = v.len() / hd;
    assert!(i0 + NB <= n && d0 + DIMS <= hd && p.len() >= nk * n && out.len() >= (NB - 1) * hd + DIMS);
    // SAFETY: F16C, AVX2 and FMA are target features of this build. Entry `k < nk`'s V
    // load reads halves `k * hd + d0 ..+ 16 <= v.len()`, its probabilities
    // `k * n + i0 + i < p.len()`; the stores write `out[i * hd..][..16]`, all asserted.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); 2]; NB];
        for k in 0..nk {
            let vk = v.as_ptr().add(k * hd + d0) as *const __m128i;
            let (v0, v1) = (_mm256_cvtph_ps(_mm_loadu_si128(vk)), _mm256_cvtph_ps(_mm_loadu_si128(vk.add(1))));
            let pk = p.as_ptr().add(k * n + i0);
            for (i, a) in a.iter_mut().enumerate() {
                let pi = _mm256_broadcast_ss(&*pk.add(i));
                a[0] = _mm256_fmadd_ps(v0, pi, a[0]);
                a[1] = _mm256_fmadd_ps(v1, pi, a[1]);
            }
        }
        for (i, a) in a.iter().enumerate() {
            let o = out.as_mut_ptr().add(i * hd);
            _mm256_storeu_ps(o, a[0]);
            _mm256_storeu_ps(o.add(8), a[1]);
        }
    }
}

/// `slot_sums::<8>` with 512-bit vectors: one register of 16 dims an item, each V row
/// widened once for eight items; every lane's FMA chain is the same.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[target_feature(enable = "avx512f")]
unsafe fn slot_sums_512(v: &[f16], p: &[f32], hd: usize, d0: usize, n: usize, i0: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let nk = v.len() / hd;
    assert!(i0 + WIDE_ITEMS <= n && d0 + DIMS <= hd && p.len() >= nk * n);
    assert!(out.len() >= (WIDE_ITEMS - 1) * hd + DIMS);
    // SAFETY: entry `k < nk`'s V load reads halves `k * hd + d0 ..+ 16 <= v.len()`, its
    // probabilities `k * n + i0 + i < p.len()`; the stores write `out[i * hd..][..16]`.
    unsafe {
        let mut a = [_mm512_setzero_ps(); WIDE_ITEMS];
        for k in 0..nk {
            let vk = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(k * hd + d0).cast()));
            let pk = p.as_ptr().add(k * n + i0);
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(vk, _mm512_set1_ps(*pk.add(i)), *a);
            }
        }
        for (i, a) in a.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(i * hd), *a);
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
fn slot_sums<const NB: usize>(v: &[f16], p: &[f32], hd: usize, d0: usize, n: usize, i0: usize, out: &mut [f32]) {
    slot_sums_scalar(v, p, hd, d0..d0 + DIMS, n, i0..i0 + NB, out)
}

/// `slot_sums` for any items and dims, one element at a time.
fn slot_sums_scalar(
    v: &[f16],
    p: &[f32],
    hd: usize,
    dims: std::ops::Range<usize>,
    n: usize,
    items: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let w = dims.len();
    for i in 0..items.len() {
        out[i * hd..][..w].fill(0.0);
    }
    for (k, vk) in v.chunks_exact(hd).enumerate() {
        for (i, item) in items.clone().enumerate() {
            let pi = p[k * n + item];
            for (a, x) in out[i * hd..][..w].iter_mut().zip(&vk[dims.clone()]) {
                *a = x.to_f32().mul_add(pi, *a);
            }
        }
    }
}
