//! Our own quantized matmuls for the formats where we want llama.cpp's exact numerics.
//!
//! A 4-bit model is sensitive to the last bit of every dot product: two correct
//! implementations that round activations or order float sums differently disagree on
//! the greedy token about as often as llama.cpp disagrees with itself between its batched
//! and token-by-token paths. These kernels reproduce ggml's x86 (AVX2) arithmetic for
//! Q4_1 and Q8_0 weights: activations quantized to Q8_1/Q8_0 with `127/amax` and
//! round-half-even, integer sums in eight lanes of four, one FMA per lane per block,
//! ggml's horizontal-sum order; the same for Q5_0 against Q8_0, and Q4_K / Q6_K against
//! Q8_K as in `kquants`. (llama.cpp's batched tinyBLAS path for Q8_0/Q5_0 performs the
//! same per-element arithmetic as its vec-dot, so one kernel serves every batch size.)
//! They are written as portable loops the compiler vectorizes; formats not listed here
//! use candle's kernels (`super::linear`).

pub(crate) mod act;
mod cols;
mod dot;
mod kquants;
mod simd;
mod stream;

use candle_core::quantized::GgmlDType;

use super::parallel_columns;
use crate::error::{Error, Result};

use act::{Q8KSign, QK, QK_K, quantize_q8_0, quantize_q8_1, quantize_q8_k};
use dot::{BlockQ4_1, BlockQ5_0, BlockQ8_0};
use kquants::{BlockQ4K, BlockQ6K, Q4KPath};

enum Weights {
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q8_0(Vec<BlockQ8_0>),
    Q4K(Vec<BlockQ4K>),
    Q6K(Vec<BlockQ6K>),
}

pub(crate) struct QuantMatMul {
    w: Weights,
    k: usize,
    k_blocks: usize,
    n: usize,
}

impl QuantMatMul {
    /// Formats with a faithful kernel here.
    pub(crate) fn supports(dtype: GgmlDType) -> bool {
        matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q8_0 | GgmlDType::Q4K | GgmlDType::Q6K)
    }

    /// From the raw GGUF bytes of an `[n, k]` matrix.
    pub(crate) fn from_bytes(name: &str, dtype: GgmlDType, bytes: &[u8], k: usize, n: usize) -> Result<Self> {
        let bad = |reason: String| Error::Tensor { name: name.to_owned(), reason };
        let block = if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) { QK_K } else { QK };
        if !k.is_multiple_of(block) {
            return Err(bad(format!("row length {k} is not a multiple of {block}")));
        }
        let k_blocks = k / block;
        let w = match dtype {
            GgmlDType::Q4_1 => Weights::Q4_1(dot::parse_q4_1(bytes)),
            GgmlDType::Q5_0 => Weights::Q5_0(dot::parse_q5_0(bytes)),
            GgmlDType::Q8_0 => Weights::Q8_0(dot::parse_q8_0(bytes)),
            GgmlDType::Q4K => Weights::Q4K(kquants::parse_q4_k(bytes)),
            GgmlDType::Q6K => Weights::Q6K(kquants::parse_q6_k(bytes)),
            other => return Err(bad(format!("no own kernel for {other:?}"))),
        };
        let blocks = match &w {
            Weights::Q4_1(b) => b.len(),
            Weights::Q5_0(b) => b.len(),
            Weights::Q8_0(b) => b.len(),
            Weights::Q4K(b) => b.len(),
            Weights::Q6K(b) => b.len(),
        };
        if blocks != k_blocks * n {
            return Err(bad(format!("{blocks} blocks, expected {}", k_blocks * n)));
        }
        Ok(Self { w, k, k_blocks, n })
    }

    /// `x` is `[m, k]`; returns `[m, n]`.
    pub(crate) fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let n = self.n;
        let mut out = vec![0.0f32; m * n];
        match &self.w {
            Weights::Q4_1(w) => self.run4(w, &quantize_q8_1(x), m, &mut out, dot::dots_q4_1()),
            Weights::Q5_0(w) => self.run4(w, &quantize_q8_0(x), m, &mut out, dot::dots_q5_0()),
            Weights::Q8_0(w) => self.run4(w, &quantize_q8_0(x), m, &mut out, dot::dots_q8_0()),
            Weights::Q4K(w) => {
                // ggml's repacked kernel takes rows four at a time, the remainder one by one.
                let grouped = if super::batched(m) { m - m % 4 } else { 0 };
                let path = |r: usize| {
                    if r < grouped { Q4KPath::Gemm } else { Q4KPath::Gemv }
                };
                self.run(w, &q8k_rows_for_q4k(x, m, grouped), m, &mut out, |w, a, r| kquants::q4_k_q8_k(w, a, path(r)))
            }
            Weights::Q6K(w) => {
                // ggml takes its tiled K-quant path from 8 rows up.
                let dot = if m >= 8 && super::batched(m) { kquants::q6_k_q8_k_tiled } else { kquants::q6_k_q8_k };
                self.run(w, &quantize_q8_k(x, Q8KSign::FirstMax), m, &mut out, |w, a, _| dot(w, a))
            }
        }
        out
    }

    /// `run` for kernels with multi-row variants: from two rows up, each column's rows go
    /// four at a time and a remainder of two or three together (the weight block is
    /// unpacked once for the group); a single leftover row takes the one-row kernel. One
    /// row alone (solo decode) goes four columns at a time (`run_cols`). Every row's
    /// arithmetic is the one-row kernel's whichever path it takes.
    fn run4<W: Sync>(&self, w: &[W], acts: &[act::ActQ8], m: usize, out: &mut [f32], dots: dot::Dots<W>) {
        let dot = dots.one;
        if m < 2 {
            return self.run_cols(w, acts, out, dot, dots.cols4);
        }
        let kb = self.k_blocks;
        let work = m * self.n * self.k;
        let row = |r: usize| &acts[r * kb..(r + 1) * kb];
        parallel_columns(out, m, COLS, work, |c, chunk| {
            for (i, col_out) in chunk.chunks_exact_mut(m).enumerate() {
                let col = c * COLS + i;
                let wr = &w[col * kb..(col + 1) * kb];
                let mut r = 0;
                while r < m {
                    let take = (m - r).min(4);
                    let o = &mut col_out[r..r + take];
                    match take {
                        1 => o[0] = dot(wr, row(r)),
                        2 => o.copy_from_slice(&(dots.x2)(wr, [row(r), row(r + 1)])),
                        3 => o.copy_from_slice(&(dots.x3)(wr, std::array::from_fn(|j| row(r + j)))),
                        _ => o.copy_from_slice(&(dots.x4)(wr, std::array::from_fn(|j| row(r + j)))),
                    }
                    r += take;
                }
            }
        });
    }

    /// One row (decode): columns four at a time, a ragged end one by one.
    fn run_cols<W: Sync>(
        &self,
        w: &[W],
        acts: &[act::ActQ8],
        out: &mut [f32],
        dot: fn(&[W], &[act::ActQ8]) -> f32,
        cols: cols::ColsN<W, 4>,
    ) {
        let kb = self.k_blocks;
        let col = |c: usize| &w[c * kb..(c + 1) * kb];
        parallel_columns(out, 1, COLS, self.n * self.k, |c, chunk| {
            let first = c * COLS;
            let done = chunk.len() / 4 * 4;
            let mut quads = chunk.chunks_exact_mut(4);
            for (q, o) in quads.by_ref().enumerate() {
                o.copy_from_slice(&cols(std::array::from_fn(|j| col(first + 4 * q + j)), acts));
            }
            for (i, o) in quads.into_remainder().iter_mut().enumerate() {
                *o = dot(col(first + done + i), acts);
            }
        });
    }

    /// Every (column, row) dot product, columns in parallel chunks.
    fn run<W: Sync, A: Sync>(
        &self,
        w: &[W],
        acts: &[A],
        m: usize,
        out: &mut [f32],
        dot: impl Fn(&[W], &[A], usize) -> f32 + Sync,
    ) {
        let kb = self.k_blocks;
        let work = m * self.n * self.k;
        parallel_columns(out, m, COLS, work, |c, chunk| {
            for (i, col_out) in chunk.chunks_exact_mut(m).enumerate() {
                let col = c * COLS + i;
                let wr = &w[col * kb..(col + 1) * kb];
                for (r, o) in col_out.iter_mut().enumerate() {
                    *o = dot(wr, &acts[r * kb..(r + 1) * kb], r);
                }
            }
        });
    }
}

/// Columns per work chunk: enough to amortize scheduling, small enough to balance.
const COLS: usize = 16;

/// Q8_K activations for the Q4_K kernels: the first `grouped` rows (whole groups of
/// four, for the repacked kernel) are quantized by ggml's 4-row routine, the rest by
/// the scalar one.
fn q8k_rows_for_q4k(x: &[f32], m: usize, grouped: usize) -> Vec<act::ActQ8K> {
    let k = x.len() / m;
    let mut out = quantize_q8_k(&x[..grouped * k], Q8KSign::AnyPositiveMax);
    out.extend(quantize_q8_k(&x[grouped * k..], Q8KSign::FirstMax));
    out
}
