//! Our own quantized matmuls for the formats where we want llama.cpp's exact numerics.
//!
//! A 4-bit model is sensitive to the last bit of every dot product: two correct
//! implementations that round activations or order float sums differently disagree on
//! the greedy token about as often as llama.cpp disagrees with itself between its batched
//! and token-by-token paths. These kernels reproduce ggml's x86 (AVX2) arithmetic for
//! Q4_1 and Q8_0 weights: activations quantized to Q8_1/Q8_0 with `127/amax` and
//! round-half-even, integer sums in eight lanes of four, one FMA per lane per block,
//! ggml's horizontal-sum order; the same for Q5_0 against Q8_0, Q5_1 against Q8_1
//! and IQ4_NL and MXFP4 against Q8_0 (`blocks32`), and Q4_K / Q6_K against Q8_K as in `kquants`,
//! Q2_K / Q3_K / Q5_K / IQ4_XS as in `kvec`; BF16 against bf16-rounded activations
//! (`bf16`). (llama.cpp's batched tinyBLAS path for Q8_0/Q5_0 performs the
//! same per-element arithmetic as its vec-dot, so one kernel serves every batch size.)
//! They are written as portable loops the compiler vectorizes; formats not listed here
//! use candle's kernels (`super::linear`).

pub(crate) mod act;
mod bf16;
mod blocks32;
mod cols;
mod dot;
mod each;
pub(crate) mod isa;
mod kquants;
mod krows;
mod ktile;
mod kvec;
mod simd;
mod stream;
#[cfg(test)]
mod testing;
mod tile;

use candle_core::quantized::GgmlDType;

use crate::gguf::Stored;

use super::parallel_columns_many;
use crate::error::{Error, Result};

use act::{Q8KSign, quantize_q8_0, quantize_q8_1, quantize_q8_k};
use bf16::BlockBf16;
/// The BF16 kernel's activation rounding, which the CUDA backend reproduces.
#[cfg(test)]
pub(crate) use bf16::round_bf16;
/// MXFP4's block scale, for the CUDA backend's repacking (`backend::cuda::weights`).
pub(crate) use blocks32::e8m0_half;
use blocks32::{BlockIq4Nl, BlockQ5_1, Iq4NlPath};
use dot::{BlockQ4_1, BlockQ5_0, BlockQ8_0};
use kquants::{BlockQ4K, BlockQ6K, Q4KPath};
use kvec::{BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ5K};

pub(crate) use each::{Job, Src};

enum Weights {
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q8_0(Vec<BlockQ8_0>),
    Q2K(Vec<BlockQ2K>),
    Q3K(Vec<BlockQ3K>),
    Q4K(Vec<BlockQ4K>),
    Q5K(Vec<BlockQ5K>),
    Q6K(Vec<BlockQ6K>),
    Iq4Nl(Vec<BlockIq4Nl>, Iq4NlPath),
    Iq4Xs(Vec<BlockIq4Xs>),
    Bf16(Vec<BlockBf16>),
}

pub(crate) struct QuantMatMul {
    w: Weights,
    k: usize,
    k_blocks: usize,
    n: usize,
}

impl QuantMatMul {
    /// Formats with a faithful kernel here, for rows of `k` values (BF16: whole steps of
    /// the kernel only).
    pub(crate) fn supports(dtype: Stored, k: usize) -> bool {
        use GgmlDType::*;
        match dtype {
            Stored::Ggml(BF16) => k.is_multiple_of(bf16::STEP),
            Stored::Ggml(d) => matches!(d, Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K),
            Stored::Iq4Nl | Stored::Iq4Xs | Stored::Mxfp4 => true,
        }
    }

    /// From the raw GGUF bytes of an `[n, k]` matrix. IQ4_NL takes ggml's repacked
    /// kernel, as llama.cpp does for a matrix of 8 rows or a multiple (`rows_in_file`: a
    /// fused matrix's part is repacked with its whole).
    pub(crate) fn from_bytes(name: &str, dtype: Stored, bytes: &[u8], k: usize, n: usize) -> Result<Self> {
        let bad = |reason: String| Error::Tensor { name: name.to_owned(), reason };
        // BF16 goes in the kernel's steps of 32 values.
        let block = if dtype == Stored::Ggml(GgmlDType::BF16) { bf16::STEP } else { dtype.block_size() };
        if !k.is_multiple_of(block) {
            return Err(bad(format!("row length {k} is not a multiple of {block}")));
        }
        let k_blocks = k / block;
        let w = match dtype {
            Stored::Iq4Nl => Weights::Iq4Nl(blocks32::parse_iq4_nl(bytes), Iq4NlPath::Repacked),
            Stored::Iq4Xs => Weights::Iq4Xs(kvec::parse_iq4_xs(bytes)),
            // IQ4_NL's kernels with MXFP4's table and scales (`blocks32`).
            Stored::Mxfp4 => Weights::Iq4Nl(blocks32::parse_mxfp4(bytes), Iq4NlPath::Repacked),
            Stored::Ggml(dtype) => Self::parse_ggml(name, dtype, bytes)?,
        };

        let blocks = match &w {
            Weights::Q4_1(b) => b.len(),
            Weights::Q5_0(b) => b.len(),
            Weights::Q5_1(b) => b.len(),
            Weights::Q8_0(b) => b.len(),
            Weights::Q2K(b) => b.len(),
            Weights::Q3K(b) => b.len(),
            Weights::Q4K(b) => b.len(),
            Weights::Q5K(b) => b.len(),
            Weights::Q6K(b) => b.len(),
            Weights::Iq4Nl(b, _) => b.len(),
            Weights::Iq4Xs(b) => b.len(),
            Weights::Bf16(b) => b.len(),
        };
        if blocks != k_blocks * n {
            return Err(bad(format!("{blocks} blocks, expected {}", k_blocks * n)));
        }
        Ok(Self { w, k, k_blocks, n })
    }

    fn parse_ggml(name: &str, dtype: GgmlDType, bytes: &[u8]) -> Result<Weights> {
        Ok(match dtype {
            GgmlDType::Q4_1 => Weights::Q4_1(dot::parse_q4_1(bytes)),
            GgmlDType::BF16 => Weights::Bf16(bf16::parse_bf16(bytes)),
            GgmlDType::Q5_0 => Weights::Q5_0(dot::parse_q5_0(bytes)),
            GgmlDType::Q5_1 => Weights::Q5_1(blocks32::parse_q5_1(bytes)),
            GgmlDType::Q8_0 => Weights::Q8_0(dot::parse_q8_0(bytes)),
            GgmlDType::Q2K => Weights::Q2K(kvec::parse_q2_k(bytes)),
            GgmlDType::Q3K => Weights::Q3K(kvec::parse_q3_k(bytes)),
            GgmlDType::Q4K => Weights::Q4K(kquants::parse_q4_k(bytes)),
            GgmlDType::Q5K => Weights::Q5K(kvec::parse_q5_k(bytes)),
            GgmlDType::Q6K => Weights::Q6K(kquants::parse_q6_k(bytes)),
            other => {
                return Err(Error::Tensor { name: name.to_owned(), reason: format!("no own kernel for {other:?}") });
            }
        })
    }

    /// IQ4_NL (or MXFP4) in a matrix of `rows_in_file` rows: llama.cpp repacks it only
    /// where that is a multiple of 8 (`ggml_repack_get_optimal_repack_type`), else takes its vec-dot.
    pub(crate) fn with_rows_in_file(mut self, rows_in_file: usize) -> Self {
        if let Weights::Iq4Nl(_, path) = &mut self.w {
            *path = if rows_in_file.is_multiple_of(8) { Iq4NlPath::Repacked } else { Iq4NlPath::VecDot };
        }
        self
    }

    /// `x` is `[m, k]`; returns `[m, n]`.
    pub(crate) fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        Self::forward_many(&[self], x, m).pop().expect("one output")
    }

    /// Several matrices against the same `x` (`[m, k]`, every matrix `k` wide) in one
    /// pool call: one barrier instead of one per matrix (Q, K and V; gate and up), and
    /// `x` quantized once per activation format. Returns each `[m, n_i]`.
    pub(crate) fn forward_many(mats: &[&QuantMatMul], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        // Kernel choices read this thread's numerics: made here, before the pool runs.
        let mut acts: Vec<Acts> = Vec::with_capacity(mats.len());
        let mut which_acts = Vec::with_capacity(mats.len());
        for w in mats {
            let want = w.acts_kind(m);
            let at = acts.iter().position(|a| a.kind() == want).unwrap_or_else(|| {
                acts.push(Acts::quantize(want, x, m));
                acts.len() - 1
            });
            which_acts.push(at);
        }
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![0.0f32; m * w.n]).collect();
        let work = mats.iter().map(|w| m * w.n * w.k).sum();
        let mut views: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let ms = vec![m; mats.len()];
        parallel_columns_many(&mut views, &ms, COLS, work, |i, c, tile| {
            mats[i].chunk(&acts[which_acts[i]], m, c, tile)
        });
        outs
    }

    /// The activation format (and kernel path) this matrix takes for `m` rows.
    fn acts_kind(&self, m: usize) -> ActsKind {
        match &self.w {
            Weights::Q4_1(_) | Weights::Q5_1(_) => ActsKind::Q8_1,
            Weights::Q5_0(_) | Weights::Q8_0(_) | Weights::Iq4Nl(..) => ActsKind::Q8_0,
            // ggml's repacked Q4_K kernel takes rows four at a time, the remainder one by one.
            Weights::Q4K(_) => ActsKind::Q8K { grouped: if super::batched(m) { m - m % 4 } else { 0 }, tiled: false },
            // ggml takes its tiled Q6_K path from 8 rows up.
            Weights::Q6K(_) => ActsKind::Q8K { grouped: 0, tiled: m >= 8 && super::batched(m) },
            // ggml's one-row vec-dot at every batch size (no repacked or tiled x86 kernel).
            Weights::Q2K(_) | Weights::Q3K(_) | Weights::Q5K(_) | Weights::Iq4Xs(_) => {
                ActsKind::Q8K { grouped: 0, tiled: false }
            }
            Weights::Bf16(_) => ActsKind::Bf16,
        }
    }

    /// Columns `c * COLS ..` (fewer at the end) into `tile`, `[row][column]`.
    fn chunk(&self, acts: &Acts, m: usize, c: usize, tile: &mut [f32]) {
        match (&self.w, acts) {
            (Weights::Q4_1(w), Acts::Q8(a, _, q)) => {
                self.chunk4(w, a, m, c, tile, dot::dots_q4_1(), q.as_ref().zip(tile::q4_1()))
            }
            (Weights::Q5_0(w), Acts::Q8(a, _, q)) => {
                self.chunk4(w, a, m, c, tile, dot::dots_q5_0(), q.as_ref().zip(tile::q5_0()))
            }
            (Weights::Q8_0(w), Acts::Q8(a, _, _)) => self.chunk4(w, a, m, c, tile, dot::dots_q8_0(), None),
            (Weights::Q5_1(w), Acts::Q8(a, _, _)) => self.chunk1(w, a, m, c, tile, |w, a, _| blocks32::q5_1_q8_1(w, a)),
            (Weights::Q2K(w), Acts::Q8K(a, _)) => self.chunk1(w, a, m, c, tile, |w, a, _| kvec::q2_k_q8_k(w, a)),
            (Weights::Q3K(w), Acts::Q8K(a, _)) => self.chunk1(w, a, m, c, tile, |w, a, _| kvec::q3_k_q8_k(w, a)),
            (Weights::Q5K(w), Acts::Q8K(a, _)) => self.chunk1(w, a, m, c, tile, |w, a, _| kvec::q5_k_q8_k(w, a)),
            (Weights::Iq4Xs(w), Acts::Q8K(a, _)) => self.chunk1(w, a, m, c, tile, |w, a, _| kvec::iq4_xs_q8_k(w, a)),
            (Weights::Bf16(w), Acts::Bf16(a)) => self.chunk1(w, a, m, c, tile, |w, a, _| bf16::bf16_dot(w, a)),
            (Weights::Iq4Nl(w, path), Acts::Q8(a, _, _)) => {
                self.chunk1(w, a, m, c, tile, |w, a, _| blocks32::iq4_nl_q8_0(w, a, *path))
            }
            // The default: every row in the one-row arithmetic, rows grouped by four.
            (Weights::Q4K(w), Acts::Q8K(a, ActsKind::Q8K { grouped: 0, .. })) => {
                self.chunk_k(w, a, m, c, tile, krows::dots_q4_k(), ktile::q4_k())
            }
            (Weights::Q4K(w), Acts::Q8K(a, ActsKind::Q8K { grouped, .. })) => {
                let path = |r: usize| if r < *grouped { Q4KPath::Gemm } else { Q4KPath::Gemv };
                self.chunk1(w, a, m, c, tile, |w, a, r| kquants::q4_k_q8_k(w, a, path(r)))
            }
            (Weights::Q6K(w), Acts::Q8K(a, ActsKind::Q8K { tiled: false, .. })) => {
                self.chunk_k(w, a, m, c, tile, krows::dots_q6_k(), ktile::q6_k())
            }
            (Weights::Q6K(w), Acts::Q8K(a, _)) => {
                self.chunk1(w, a, m, c, tile, |w, a, _| kquants::q6_k_q8_k_tiled(w, a))
            }
            _ => unreachable!("activations are quantized for the matrix's own format"),
        }
    }

    /// A chunk for kernels with multi-row variants: from two rows up, each column's rows
    /// go four at a time and a remainder of two or three together (the weight block is
    /// unpacked once for the group); a single leftover row takes the one-row kernel. One
    /// row alone (solo decode) goes four columns at a time. Where a `tiles` kernel is
    /// given, whole groups of four rows go two columns at a time (`tile.rs`). Every
    /// row's arithmetic is the one-row kernel's whichever path it takes.
    #[allow(clippy::too_many_arguments)]
    fn chunk4<W>(
        &self,
        w: &[W],
        acts: &[act::ActQ8],
        m: usize,
        c: usize,
        tile: &mut [f32],
        dots: dot::Dots<W>,
        tiles: Option<(&tile::Quads, tile::Tile<W>)>,
    ) {
        let kb = self.k_blocks;
        let dot = dots.one;
        let first = c * COLS;
        let col = |j: usize| &w[(first + j) * kb..(first + j + 1) * kb];
        if m < 2 {
            let done = tile.len() / 4 * 4;
            let mut quads = tile.chunks_exact_mut(4);
            for (q, o) in quads.by_ref().enumerate() {
                o.copy_from_slice(&(dots.cols4)(std::array::from_fn(|j| col(4 * q + j)), acts));
            }
            for (i, o) in quads.into_remainder().iter_mut().enumerate() {
                *o = dot(col(done + i), acts);
            }
            return;
        }
        let row = |r: usize| &acts[r * kb..(r + 1) * kb];
        let wide = tiles.map(|(quads, kernel)| {
            move |ws: [&[W]; tile::TILE_COLS], r: usize| {
                kernel(ws, std::array::from_fn(|j| row(r + j)), quads.group(r / 4, kb))
            }
        });
        let wide = wide.as_ref().map(|p| p as WideFn<'_, W, { tile::TILE_COLS }>);
        self.column_groups(w, m, c, tile, size_of_val(row(0)), wide, |wr, r, o| match o.len() {
            1 => o[0] = dot(wr, row(r)),
            2 => o.copy_from_slice(&(dots.x2)(wr, [row(r), row(r + 1)])),
            3 => o.copy_from_slice(&(dots.x3)(wr, std::array::from_fn(|j| row(r + j)))),
            _ => o.copy_from_slice(&(dots.x4)(wr, std::array::from_fn(|j| row(r + j)))),
        });
    }

    /// A K-quant chunk in the one-row arithmetic, each column's rows in groups of four;
    /// where a `tiles` kernel is given, whole groups of four go two columns at a time.
    #[allow(clippy::too_many_arguments)]
    fn chunk_k<W>(
        &self,
        w: &[W],
        acts: &[act::ActQ8K],
        m: usize,
        c: usize,
        tile: &mut [f32],
        dots: krows::KDots<W>,
        tiles: Option<ktile::KTile<W>>,
    ) {
        let kb = self.k_blocks;
        let row = |r: usize| &acts[r * kb..(r + 1) * kb];
        let pair = tiles.map(|kernel| move |ws: [&[W]; 2], r: usize| kernel(ws, std::array::from_fn(|j| row(r + j))));
        let pair = pair.as_ref().map(|p| p as WideFn<'_, W, 2>);
        self.column_groups(w, m, c, tile, size_of_val(row(0)), pair, |wr, r, o| match o.len() {
            1 => o.copy_from_slice(&(dots.x1)(wr, [row(r)])),
            2 => o.copy_from_slice(&(dots.x2)(wr, [row(r), row(r + 1)])),
            3 => o.copy_from_slice(&(dots.x3)(wr, std::array::from_fn(|j| row(r + j)))),
            _ => o.copy_from_slice(&(dots.x4)(wr, std::array::from_fn(|j| row(r + j)))),
        });
    }

    /// Each column of the chunk against the rows four at a time (the last group holds
    /// what is left): `group(weights of the column, first row, outputs of the group)`;
    /// with a `wide` kernel, whole groups of four go `C` columns at a time
    /// (`wide([C columns' weights], first row) -> [column][row]`).
    /// Rows go in blocks whose activations (`row_bytes` each) stay in L1 while every
    /// column of the chunk passes over them; the order changes no row's arithmetic.
    #[allow(clippy::too_many_arguments)]
    fn column_groups<W, const C: usize>(
        &self,
        w: &[W],
        m: usize,
        c: usize,
        tile: &mut [f32],
        row_bytes: usize,
        wide: Option<WideFn<'_, W, C>>,
        group: impl Fn(&[W], usize, &mut [f32]),
    ) {
        let kb = self.k_blocks;
        let width = tile.len() / m.max(1);
        let weights = |i: usize| &w[(c * COLS + i) * kb..][..kb];
        let rows_per = (ACT_BLOCK_BYTES / row_bytes.max(1)).max(4) / 4 * 4;
        for first in (0..m).step_by(rows_per) {
            let last = (first + rows_per).min(m);
            // Rows `first..whole` are whole groups of four.
            let whole = first + (last - first) / 4 * 4;
            let mut i = 0;
            // Rows `r..` of column `j` (at most four) through `group`, into the tile.
            let rows = |tile: &mut [f32], j: usize, r: usize| {
                let mut got = [0.0f32; 4];
                let got = &mut got[..(last - r).min(4)];
                group(weights(j), r, got);
                got.iter().enumerate().for_each(|(k, &v)| tile[(r + k) * width + j] = v);
            };
            if let Some(wide) = wide.filter(|_| whole > first) {
                while i + C <= width {
                    let ws = std::array::from_fn(|j| weights(i + j));
                    for r in (first..whole).step_by(4) {
                        let got = wide(ws, r);
                        for k in 0..4 {
                            for (j, col) in got.iter().enumerate() {
                                tile[(r + k) * width + i + j] = col[k];
                            }
                        }
                    }
                    if whole < last {
                        for j in i..i + C {
                            rows(tile, j, whole);
                        }
                    }
                    i += C;
                }
            }
            for j in i..width {
                for r in (first..last).step_by(4) {
                    rows(tile, j, r);
                }
            }
        }
    }

    /// A chunk, every (column, row) dot product on its own.
    fn chunk1<W, A>(
        &self,
        w: &[W],
        acts: &[A],
        m: usize,
        c: usize,
        tile: &mut [f32],
        dot: impl Fn(&[W], &[A], usize) -> f32,
    ) {
        let kb = self.k_blocks;
        let width = tile.len() / m.max(1);
        for i in 0..width {
            let col = c * COLS + i;
            let wr = &w[col * kb..(col + 1) * kb];
            for r in 0..m {
                tile[r * width + i] = dot(wr, &acts[r * kb..(r + 1) * kb], r);
            }
        }
    }
}

/// The f32 values of one stored row of a type candle does not read (an IQ4 embedding
/// table's row).
pub(crate) fn dequantize_row(dtype: Stored, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Stored::Iq4Nl => blocks32::dequantize_iq4_nl(bytes),
        Stored::Iq4Xs => kvec::dequantize_iq4_xs(bytes),
        Stored::Mxfp4 => blocks32::dequantize_mxfp4(bytes),
        Stored::Ggml(d) => unreachable!("{d:?} rows are candle's to dequantize"),
    }
}

/// Which quantized form of the activations a matrix reads, with the kernel path chosen
/// for the batch size (Q8_K: rows in ggml's 4-row groups, the tiled Q6_K kernel).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ActsKind {
    Q8_0,
    Q8_1,
    Q8K { grouped: usize, tiled: bool },
    Bf16,
}

enum Acts {
    /// With the rows' scales laid out for the tile kernels where they run.
    Q8(Vec<act::ActQ8>, ActsKind, Option<tile::Quads>),
    Q8K(Vec<act::ActQ8K>, ActsKind),
    Bf16(Vec<[f32; bf16::STEP]>),
}

impl Acts {
    fn quantize(kind: ActsKind, x: &[f32], m: usize) -> Self {
        match kind {
            ActsKind::Q8_0 | ActsKind::Q8_1 => {
                let a = if kind == ActsKind::Q8_0 { quantize_q8_0(x) } else { quantize_q8_1(x) };
                Acts::q8(a, kind, m)
            }
            ActsKind::Q8K { grouped, .. } => Acts::Q8K(q8k_rows_for_q4k(x, m, grouped), kind),
            ActsKind::Bf16 => Acts::Bf16(bf16::acts_bf16(x)),
        }
    }

    /// Q8_0 / Q8_1 activations of `m` rows, with their scales laid out for the tile
    /// kernels where those run.
    fn q8(a: Vec<act::ActQ8>, kind: ActsKind, m: usize) -> Self {
        let quads = (m >= 4 && isa::vnni()).then(|| tile::Quads::new(&a, m, a.len() / m));
        Acts::Q8(a, kind, quads)
    }

    fn kind(&self) -> ActsKind {
        match self {
            Acts::Q8(_, k, _) | Acts::Q8K(_, k) => *k,
            Acts::Bf16(_) => ActsKind::Bf16,
        }
    }
}

/// A `C`-column tile kernel bound to its activations: `(C columns' weights, first of four
/// rows) -> [column][row]`.
type WideFn<'a, W, const C: usize> = &'a dyn Fn([&[W]; C], usize) -> [[f32; 4]; C];

/// Columns per work chunk: enough to amortize scheduling, small enough to balance.
const COLS: usize = 16;

/// Activation bytes a chunk keeps in L1 while its columns pass over them (about half of
/// a 32 or 48 KiB L1; the chunk's weights take most of the rest).
const ACT_BLOCK_BYTES: usize = 16 * 1024;

/// Q8_K activations for the Q4_K kernels: the first `grouped` rows (whole groups of
/// four, for the repacked kernel) are quantized by ggml's 4-row routine, the rest by
/// the scalar one.
fn q8k_rows_for_q4k(x: &[f32], m: usize, grouped: usize) -> Vec<act::ActQ8K> {
    let k = x.len() / m;
    let mut out = quantize_q8_k(&x[..grouped * k], Q8KSign::AnyPositiveMax);
    out.extend(quantize_q8_k(&x[grouped * k..], Q8KSign::FirstMax));
    out
}

#[cfg(test)]
mod tests;
