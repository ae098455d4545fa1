//! A tile's attention probabilities, key-major: the softmax of every item's scores
//! done for all items of a key at once (the items are the vector lanes), in slot order
//! for the V sums (`super::tile`).
//!
//! Per item this is exactly `softmax_in_place` + `round_probs` over the keys it sees:
//! unseen keys hold -inf, so they do not move the maximum and their `exp` is exactly 0;
//! the 16-key chunk sums then include those zeros where `softmax_in_place` pads its
//! partial chunks with zeros, and a chunk an item does not see at all adds +0 to its
//! f64 sum, which leaves it unchanged.

use super::order::{LANES, Order, reduce16_lanes};
use super::values::{round_probs, round_probs_each};
use super::{sink_max, softmax_in_place};
use crate::kernels::ops::expf_shifted_each;

/// Keys `jlo..=jhi` laid out slot by slot (`[slot][k][..]`, key `j` at slot `j % slots`,
/// k-th of that slot's keys), so each slot's FMA chain reads its keys contiguously.
pub(super) struct SlotMajor {
    pub(super) slots: usize,
    /// The multiple of `slots` at or below `jlo`: key `base + slot + k * slots` is entry
    /// `(slot, k)`.
    base: usize,
    /// Entries per slot.
    per_slot: usize,
    pub(super) jlo: usize,
    pub(super) jhi: usize,
}

impl SlotMajor {
    pub(super) fn new(order: Order, keys: std::ops::RangeInclusive<usize>) -> Self {
        let (jlo, jhi, slots) = (*keys.start(), *keys.end(), order.slots());
        let base = jlo / slots * slots;
        SlotMajor { slots, base, per_slot: (jhi + 1 - base).div_ceil(slots), jlo, jhi }
    }

    pub(super) fn len(&self) -> usize {
        self.slots * self.per_slot
    }

    /// Entry of key `j`.
    pub(super) fn at(&self, j: usize) -> usize {
        let r = j - self.base;
        (r % self.slots) * self.per_slot + r / self.slots
    }

    /// Entries of `slot` that hold keys (of `jlo..=jhi`).
    pub(super) fn entries(&self, slot: usize) -> std::ops::Range<usize> {
        let first = self.base + slot;
        let k0 = usize::from(first < self.jlo);
        let k1 = if self.jhi >= first { (self.jhi - first) / self.slots + 1 } else { 0 };
        slot * self.per_slot + k0..slot * self.per_slot + k1.max(k0)
    }
}

/// `p` (`[entry][item]`, `n` items, entries of `slots`) from scaled scores, -inf where an
/// item does not see a key, to f16-rounded probabilities, 0 where it does not. `sinks`:
/// each item's head's sink logit (`AttnSpec::sinks`).
pub(super) fn tile_probs(p: &mut [f32], n: usize, slots: &SlotMajor, sinks: Option<&[f32]>) {
    if n < 8 {
        return by_item(p, n, slots, sinks);
    }
    let mut max = vec![f32::NEG_INFINITY; n];
    for row in p.chunks_exact(n) {
        for (m, x) in max.iter_mut().zip(row) {
            *m = m.max(*x);
        }
    }
    if let Some(s) = sinks {
        max.iter_mut().zip(s).for_each(|(m, &s)| *m = sink_max(*m, s));
    }
    for row in p.chunks_exact_mut(n) {
        expf_shifted_each(row, &max);
    }
    // The f64 sum of 16-key chunk sums (`reduce16` per item, as `reduce16_lanes` with
    // the items as its dims), chunks aligned to absolute position 0, keys outside
    // `jlo..=jhi` as zeros.
    let mut sum = vec![0.0f64; n];
    let (mut x, mut chunk) = (vec![0.0f32; LANES * n], vec![0.0f32; n]); // [lane][item]
    for c in slots.jlo / LANES..=slots.jhi / LANES {
        for (l, xl) in x.chunks_exact_mut(n).enumerate() {
            let j = c * LANES + l;
            match (slots.jlo..=slots.jhi).contains(&j) {
                true => xl.copy_from_slice(&p[slots.at(j) * n..][..n]),
                false => xl.fill(0.0),
            }
        }
        reduce16_lanes(&mut x, n, &mut chunk);
        for (s, c) in sum.iter_mut().zip(&chunk) {
            *s += *c as f64;
        }
    }
    if let Some(s) = sinks {
        for ((sum, &s), &m) in sum.iter_mut().zip(s).zip(&max) {
            *sum += f64::from((s - m).exp());
        }
    }
    let inv: Vec<f32> = sum.iter().map(|s| (1.0 / s) as f32).collect();
    for row in p.chunks_exact_mut(n) {
        round_probs_each(row, &inv);
    }
}

/// `tile_probs` for fewer items than vector lanes (a decoding row's heads): each item's
/// scores copied out in key order, through `softmax_in_place` over the whole key range
/// (the -inf of unseen keys become the zeros it pads partial chunks with) and
/// `round_probs`, and back.
fn by_item(p: &mut [f32], n: usize, slots: &SlotMajor, sinks: Option<&[f32]>) {
    let entry: Vec<usize> = (slots.jlo..=slots.jhi).map(|j| slots.at(j) * n).collect();
    let mut row = vec![0.0f32; entry.len()];
    for i in 0..n {
        for (x, &e) in row.iter_mut().zip(&entry) {
            *x = p[e + i];
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = softmax_in_place(&mut row, slots.jlo, max, sinks.map(|s| s[i]));
        round_probs(&mut row, inv);
        for (x, &e) in row.iter().zip(&entry) {
            p[e + i] = *x;
        }
    }
}
