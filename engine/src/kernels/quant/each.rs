//! Matrices each against rows of their own in one pool call (a mixture's experts): the
//! rows a slice of their own, or picked from a batch that several matrices share.
//!
//! Picked rows take the batch's activations: each batch row is quantized once, before
//! the pool call, and every job that picks it copies its blocks (llama.cpp's
//! `mul_mat_id` quantizes its input once for every expert the same way). That is the
//! same arithmetic as quantizing the picked rows themselves wherever a row's
//! quantization does not depend on the rows beside it — Q8_0, Q8_1, BF16, and Q8_K by
//! the one-row routine; Q8_K for ggml's 4-row Q4_K groups (`ActsKind::Q8K { grouped }`)
//! does depend on them, so those jobs gather their f32 rows and quantize them as a slice.

use std::sync::OnceLock;

use super::{Acts, ActsKind, COLS, QuantMatMul, parallel_columns_many};

/// A job's activation rows.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    /// `[m, k]` of its own.
    Rows(&'a [f32]),
    /// Rows `rows` of the batch `x` (`[_, k]`), in that order.
    Picked { x: &'a [f32], rows: &'a [usize] },
}

impl Src<'_> {
    /// The rows as one `[m, k]` buffer (copied where picked).
    pub(crate) fn gather(&self, k: usize) -> std::borrow::Cow<'_, [f32]> {
        match *self {
            Src::Rows(x) => x.into(),
            Src::Picked { x, rows } => rows.iter().flat_map(|&r| &x[r * k..][..k]).copied().collect(),
        }
    }

    /// Whether two jobs read the same rows (the same slice, or the same picks of one batch).
    fn same(&self, other: &Src<'_>) -> bool {
        match (self, other) {
            (Src::Rows(a), Src::Rows(b)) => std::ptr::eq(*a, *b),
            (Src::Picked { x: a, rows: r }, Src::Picked { x: b, rows: s }) => {
                std::ptr::eq(*a, *b) && std::ptr::eq(*r, *s)
            }
            _ => false,
        }
    }
}

/// One matmul of `QuantMatMul::forward_each`: `w` against `m` rows.
pub(crate) struct Job<'a> {
    pub(crate) w: &'a QuantMatMul,
    pub(crate) x: Src<'a>,
    pub(crate) m: usize,
}

impl ActsKind {
    /// The quantization this kind takes, where a row's does not depend on its batch (the
    /// kernel path aside: Q6_K's tiled flag reads the same Q8_K rows).
    fn per_row(self) -> Option<ActsKind> {
        match self {
            ActsKind::Q8K { grouped: 0, .. } => Some(ActsKind::Q8K { grouped: 0, tiled: false }),
            ActsKind::Q8K { .. } => None,
            other => Some(other),
        }
    }
}

impl Acts {
    /// Rows `rows` of a batch's activations (`t` rows), as `kind` reads them.
    fn pick(&self, t: usize, rows: &[usize], kind: ActsKind) -> Acts {
        fn copy<T: Copy>(a: &[T], t: usize, rows: &[usize]) -> Vec<T> {
            let per = a.len() / t.max(1);
            rows.iter().flat_map(|&r| &a[r * per..][..per]).copied().collect()
        }
        match self {
            Acts::Q8(a, ..) => Acts::q8(copy(a, t, rows), kind, rows.len()),
            Acts::Q8K(a, _) => Acts::Q8K(copy(a, t, rows), kind),
            Acts::Bf16(a) => Acts::Bf16(copy(a, t, rows)),
        }
    }
}

/// A job's activations: its rows, their count and width, the kind its matrix reads, the
/// batch its rows are picked from (an index into the quantized batches), and the
/// activations once made.
struct Slot<'a> {
    x: Src<'a>,
    m: usize,
    k: usize,
    kind: ActsKind,
    batch: Option<usize>,
    acts: OnceLock<Acts>,
}

impl QuantMatMul {
    /// Matrices each against rows of its own, in one pool call: job `i`'s `[m, n]`
    /// product into `outs[i]`. Jobs on the same rows share their quantized activations
    /// where they take the same format, and picked rows share their batch's (see the
    /// module's notes); a row's arithmetic is what `forward` of its job alone computes.
    /// Each job's activations (and each picked batch's quantization) are made inside the
    /// pool call by the first task that needs them, so making one expert's overlaps
    /// another's matmuls.
    pub(crate) fn forward_each(jobs: &[Job<'_>], outs: &mut [&mut [f32]]) {
        // Kernel choices read this thread's numerics: made here, before the pool runs.
        let mut batches: Vec<(&[f32], ActsKind, OnceLock<Acts>)> = Vec::new();
        let mut slots: Vec<Slot<'_>> = Vec::with_capacity(jobs.len());
        let mut which = Vec::with_capacity(jobs.len());
        for j in jobs {
            let (kind, k) = (j.w.acts_kind(j.m), j.w.k);
            let at = slots.iter().position(|s| s.x.same(&j.x) && s.kind == kind).unwrap_or_else(|| {
                let batch = match (j.x, kind.per_row()) {
                    (Src::Picked { x, .. }, Some(q)) if j.m > 0 => {
                        let found = batches.iter().position(|(b, bq, _)| std::ptr::eq(*b, x) && *bq == q);
                        Some(found.unwrap_or_else(|| {
                            batches.push((x, q, OnceLock::new()));
                            batches.len() - 1
                        }))
                    }
                    _ => None,
                };
                slots.push(Slot { x: j.x, m: j.m, k, kind, batch, acts: OnceLock::new() });
                slots.len() - 1
            });
            which.push(at);
        }
        let ms: Vec<usize> = jobs.iter().map(|j| j.m).collect();
        let work = jobs.iter().map(|j| j.m * j.w.n * j.w.k).sum();
        parallel_columns_many(outs, &ms, COLS, work, |i, c, tile| {
            let s = &slots[which[i]];
            let a = s.acts.get_or_init(|| match (s.batch, s.x) {
                (Some(b), Src::Picked { x, rows }) => {
                    let (_, q, acts) = &batches[b];
                    let t = x.len() / s.k;
                    acts.get_or_init(|| Acts::quantize(*q, x, t)).pick(t, rows, s.kind)
                }
                _ => Acts::quantize(s.kind, &s.x.gather(s.k), s.m),
            });
            jobs[i].w.chunk(a, s.m, c, tile)
        });
    }
}
