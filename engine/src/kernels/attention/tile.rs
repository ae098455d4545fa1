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
use half::slice::HalfFloatSliceExt;

use super::order::{LANES, Order, reduce16_lanes};
use super::probs::{SlotMajor, tile_probs};
use super::{AttnSpec, f16_round_into};
use crate::kv::{BLOCK_TOKENS, SeqCache};

/// Output dims a V register tile covers.
const DIMS: usize = 16;
/// Items a V register tile covers.
const ITEMS: usize = 4;

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
    tile_probs(&mut probs, n, &slots);
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
struct KvRows<'a> {
    /// `(K plane, V plane)` of each block from the first key's.
    blocks: Vec<(&'a [f16], &'a [f16])>,
    /// Offset of the head's row within a position's `kv_dim` floats, and `kv_dim`.
    off: usize,
    kv_dim: usize,
    hd: usize,
    jlo: usize,
    jhi: usize,
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

    fn k(&self, j: usize) -> &'a [f16] {
        let (b, s) = self.at(j);
        &self.blocks[b].0[s..s + self.hd]
    }

    fn v(&self, j: usize) -> &'a [f16] {
        let (b, s) = self.at(j);
        &self.blocks[b].1[s..s + self.hd]
    }
}

/// Scaled scores of every item at every key it sees, into `out` (`[entry][item]`, entries
/// of `slots`; the rest is left as it is).
fn score_keys(
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
    match (order, q.len()) {
        (Order::Single, 64) => lanes8_hd::<64, true>(q, k),
        (Order::Single, 128) => lanes8_hd::<128, true>(q, k),
        (Order::Single, 256) => lanes8_hd::<256, true>(q, k),
        (Order::Batched, 64) => lanes8_hd::<64, false>(q, k),
        (Order::Batched, 128) => lanes8_hd::<128, false>(q, k),
        (Order::Batched, 256) => lanes8_hd::<256, false>(q, k),
        _ => std::array::from_fn(|r| order.dot(q, &k[r * q.len()..][..q.len()])),
    }
}

/// `lanes8` for head size `HD`, in the one-row order if `SINGLE`. The query's `HD / 8`
/// vectors are loaded once for the eight keys.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
fn lanes8_hd<const HD: usize, const SINGLE: bool>(q: &[f32], k: &[f32]) -> [f32; 8] {
    use std::arch::x86_64::*;
    assert!(q.len() == HD && HD <= 256 && k.len() >= 8 * HD);
    let mut out = [0.0f32; 8];
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
        // reduce16's second step for rows r, r + 1: [t6 of r | t6 of r + 1].
        let t6 = |a: __m256, b: __m256| {
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
        };
        // Its third: [r: t6[0] + t6[2], t6[1] + t6[3], r + 2: same | r + 1, r + 3].
        let pairs =
            |a: __m256, b: __m256| _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
        let z0 = pairs(t6(t3(0), t3(1)), t6(t3(2), t3(3)));
        let z1 = pairs(t6(t3(4), t3(5)), t6(t3(6), t3(7)));
        // The last: rows [0, 2, 4, 6 | 1, 3, 5, 7], put in order.
        let r = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(z0, z1), _mm256_shuffle_ps::<0xDD>(z0, z1));
        let r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_ps(out.as_mut_ptr(), r);
    }
    out
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn lanes8(order: Order, q: &[f32], k: &[f32]) -> [f32; 8] {
    let hd = q.len();
    std::array::from_fn(|r| order.dot(q, &k[r * hd..][..hd]))
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
    let sums = sized(sums, groups * n * hd); // [group][item][dim]
    let lanes = sized(lanes, n * LANES * hd); // [item][lane][dim]
    for l in 0..LANES {
        for gr in 0..groups {
            let e = slots.entries(gr * LANES + l);
            let (v, p) = (&vals[e.start * hd..e.end * hd], &probs[e.start * n..e.end * n]);
            let s = &mut sums[gr * n * hd..][..n * hd];
            for d0 in (0..hd).step_by(DIMS) {
                for i0 in (0..n).step_by(ITEMS) {
                    let at = &mut s[i0 * hd + d0..];
                    match (hd - d0 >= DIMS, ITEMS.min(n - i0)) {
                        (true, 4) => slot_sums::<4>(v, p, hd, d0, n, i0, at),
                        (true, 3) => slot_sums::<3>(v, p, hd, d0, n, i0, at),
                        (true, 2) => slot_sums::<2>(v, p, hd, d0, n, i0, at),
                        (true, _) => slot_sums::<1>(v, p, hd, d0, n, i0, at),
                        (false, ni) => slot_sums_scalar(v, p, hd, d0..hd, n, i0..i0 + ni, at),
                    }
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
