//! A batch: several sequences in one forward pass. Their tokens are stacked into one
//! activation matrix, so every weight matrix is read once for all of them; what is per
//! sequence — positions (rotary), K/V writes and attention over its own cache, which
//! rows produce logits — goes row by row. The batch is the unit a backend executes; the
//! architectures (`crate::model`) pass it through and never look inside.
//!
//! Output never depends on the company a row keeps: with the default batch-invariant
//! numerics every matmul row takes the one-row arithmetic, and attention reads only the
//! row's own cache, so a row's logits are bit-identical to the same tokens run alone.

use crate::kernels::rope::RopeTable;
use crate::kernels::{AttnSpec, attention_batch};
use crate::kv::SeqCache;

/// Which rows of logits a forward pass should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that is not the last).
    None,
    /// Only the last position's (`[vocab]`).
    Last,
    /// Every position's (`[T][vocab]`, for scoring/teacher forcing).
    All,
}

/// One sequence's share of a forward pass: `tokens` run at positions `cache.len()..`.
pub struct Row<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut SeqCache,
    pub logits: Logits,
}

/// Where each row's tokens sit in the stacked activations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spans {
    /// `(first stacked row, tokens, first position)` per row.
    spans: Vec<(usize, usize, usize)>,
    total: usize,
}

impl Spans {
    pub(crate) fn of(rows: &[Row<'_>]) -> Self {
        let mut spans = Vec::with_capacity(rows.len());
        let mut at = 0;
        for r in rows {
            spans.push((at, r.tokens.len(), r.cache.len()));
            at += r.tokens.len();
        }
        Spans { spans, total: at }
    }

    /// Every row's tokens, stacked; and room for them in every cache.
    pub(crate) fn stack(rows: &mut [Row<'_>]) -> Vec<u32> {
        let mut out = Vec::with_capacity(rows.iter().map(|r| r.tokens.len()).sum());
        for r in rows.iter_mut() {
            out.extend_from_slice(r.tokens);
            r.cache.reserve(r.tokens.len());
        }
        out
    }

    /// Rotary angles for every stacked row at its own position.
    pub(crate) fn rope(&self, head_dim: usize, base: f32) -> RopeTable {
        let positions = self.spans.iter().flat_map(|&(_, n, pos0)| pos0..pos0 + n);
        RopeTable::at(positions, head_dim, base)
    }

    /// Write each row's K/V (`[total][kv_dim]`) into its cache for `layer`, then attend
    /// each row's queries (`[total][q_dim]`) over its own cache. Returns `[total][q_dim]`.
    pub(crate) fn attend(
        &self,
        rows: &mut [Row<'_>],
        layer: usize,
        (q, k, v): (&[f32], &[f32], &[f32]),
        spec: &AttnSpec,
    ) -> Vec<f32> {
        let (q_dim, kv_dim) = (q.len() / self.total, k.len() / self.total);
        for (r, &(at, n, pos0)) in rows.iter_mut().zip(&self.spans) {
            let kv = at * kv_dim..(at + n) * kv_dim;
            r.cache.write(layer, pos0, &k[kv.clone()], &v[kv]);
        }
        let parts: Vec<(&SeqCache, usize, &[f32])> = rows
            .iter()
            .zip(&self.spans)
            .map(|(r, &(at, n, pos0))| (&*r.cache, pos0, &q[at * q_dim..(at + n) * q_dim]))
            .collect();
        attention_batch(&parts, layer, spec)
    }

    /// Mark every row's new positions valid (after the whole pass succeeded).
    pub(crate) fn commit(&self, rows: &mut [Row<'_>]) {
        for (r, &(_, n, _)) in rows.iter_mut().zip(&self.spans) {
            r.cache.commit(n);
        }
    }

    /// `(first stacked row, tokens, first position)` of each row.
    pub(crate) fn each(&self) -> &[(usize, usize, usize)] {
        &self.spans
    }

    /// The stacked rows whose final hidden state needs logits, and how many each row has.
    pub(crate) fn logit_rows(&self, rows: &[Row<'_>]) -> (Vec<usize>, Vec<usize>) {
        let mut picked = Vec::new();
        let mut counts = Vec::with_capacity(rows.len());
        for (r, &(at, n, _)) in rows.iter().zip(&self.spans) {
            let mine = match r.logits {
                Logits::None => at + n..at + n,
                Logits::Last => at + n - 1..at + n,
                Logits::All => at..at + n,
            };
            counts.push(mine.len());
            picked.extend(mine);
        }
        (picked, counts)
    }

    /// The final hidden rows that need logits (`[k][hidden]`), and how many each row has.
    pub(crate) fn output_rows(&self, rows: &[Row<'_>], x: &[f32], hidden: usize) -> (Vec<f32>, Vec<usize>) {
        let (picked, counts) = self.logit_rows(rows);
        (picked.iter().flat_map(|&i| &x[i * hidden..(i + 1) * hidden]).copied().collect(), counts)
    }
}

/// Split stacked logits (`[k][vocab]`) back into one vector per row.
pub(crate) fn split(logits: Vec<f32>, counts: &[usize], vocab: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0;
    for &c in counts {
        out.push(logits[at * vocab..(at + c) * vocab].to_vec());
        at += c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_split_back_by_row() {
        let v = (0..12).map(|i| i as f32).collect();
        let got = split(v, &[1, 0, 2], 4);
        assert_eq!(got, vec![vec![0.0, 1.0, 2.0, 3.0], vec![], (4..12).map(|i| i as f32).collect()]);
    }
}
