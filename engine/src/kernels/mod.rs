//! Compute kernels, the seam between architectures and hardware.
//!
//! Architectures (`crate::model`) only call what this module exports: `Linear` (a
//! weight matrix in its stored format, today backed by candle's quantized matmuls per
//! GGML type), `attention` over the paged KV cache, and the small row ops in `ops`. A
//! faster kernel for one quantization format, or a GPU backend, replaces an
//! implementation here without touching `llama.rs` or `gemma3.rs`.

// Kernels index lanes and blocks explicitly: the index *is* the layout being emulated.
#![allow(clippy::needless_range_loop)]

mod attention;
mod linear;
pub mod ops;
pub(crate) mod quant;

pub use attention::{AttnSpec, attention, attention_batch};
pub use linear::{Embedding, Linear};

use std::cell::Cell;

/// Which arithmetic the kernels use, where llama.cpp's depends on the batch size.
///
/// llama.cpp computes a row differently when it is one of many (prefill: tiled K-quant
/// kernels, tinyBLAS attention dots) than when it is alone (decode: vec-dot kernels),
/// so the same prompt evaluated in one batch or split in two gives slightly different
/// logits, enough to change a greedy token now and then. A prompt cache splits prompts
/// wherever the cached prefix ends, so corral's default is batch-invariant: every row
/// takes the one-row (vec-dot) path, whose arithmetic is llama.cpp's decode arithmetic,
/// and output never depends on what was cached. `LlamaCpp` reproduces llama.cpp's
/// batch-dependent choice exactly (the oracle tests check both paths against it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    #[default]
    BatchInvariant,
    LlamaCpp,
}

thread_local! {
    static NUMERICS: Cell<Numerics> = const { Cell::new(Numerics::BatchInvariant) };
}

/// Run `f` with the kernels in `mode` on this thread (kernel choices are made on the
/// calling thread before work is spread over the pool).
pub(crate) fn with_numerics<T>(mode: Numerics, f: impl FnOnce() -> T) -> T {
    let before = NUMERICS.with(|n| n.replace(mode));
    let out = f();
    NUMERICS.with(|n| n.set(before));
    out
}

/// Whether rows of a batch of `m` take llama.cpp's batched arithmetic.
pub(crate) fn batched(m: usize) -> bool {
    m > 1 && NUMERICS.with(Cell::get) == Numerics::LlamaCpp
}

/// Split `out` into chunks of `chunk` elements and run `f(chunk_index, chunk)` for each
/// on the worker pool (inline when `work` is small). Each chunk is handed to exactly one
/// call; the per-chunk mutex is uncontended and only proves that to the compiler.
pub(crate) fn parallel_chunks(out: &mut [f32], chunk: usize, work: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let slots: Vec<std::sync::Mutex<&mut [f32]>> = out.chunks_mut(chunk).map(std::sync::Mutex::new).collect();
    parallel_for(slots.len(), work, |range| {
        for i in range {
            let mut c = slots[i].lock().unwrap_or_else(|e| e.into_inner());
            f(i, &mut c);
        }
    });
}

/// Fill `out` (`[m, n]`, row-major) a chunk of `cols` columns at a time on the worker
/// pool: `f(c, tile)` computes columns `c * cols ..` (fewer in the last chunk) into
/// `tile`, laid out `[column][row]`, which is then copied into place. Matmul kernels
/// produce a column's rows together; the copy from a cache-resident tile replaces a
/// transpose of the whole output (8.6 % of a Gemma prefill).
pub(crate) fn parallel_columns(
    out: &mut [f32],
    m: usize,
    cols: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    /// `out`'s base, shared by the tasks; each writes only its own columns.
    struct Base(*mut f32);
    // SAFETY: tasks write disjoint elements (see below), so sharing the pointer is sound.
    unsafe impl Sync for Base {}
    let n = out.len() / m.max(1);
    debug_assert_eq!(n * m, out.len());
    let base = Base(out.as_mut_ptr());
    parallel_for(n.div_ceil(cols), work, |range| {
        let base = &base;
        let mut tile = vec![0.0f32; cols * m];
        for c in range {
            let first = c * cols;
            let width = cols.min(n - first);
            let tile = &mut tile[..width * m];
            f(c, tile);
            for (j, column) in tile.chunks_exact(m).enumerate() {
                for (r, &v) in column.iter().enumerate() {
                    debug_assert!(r * n + first + j < n * m);
                    // SAFETY: `r < m` and `first + j < n`, so the index is inside `out`,
                    // which outlives this call; chunk `c` is handed to exactly one task and
                    // owns columns `first..first + width`, so no element is written twice
                    // or read while written.
                    unsafe { *base.0.add(r * n + first + j) = v };
                }
            }
        }
    });
}

/// Run `f` over `0..n` items on candle's CPU worker pool (the one its matmuls use, so
/// our kernels never compete with spinning matmul workers), or inline when the work is
/// too small to pay for waking the pool.
pub(crate) fn parallel_for(n: usize, work: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    const MIN_PARALLEL_WORK: usize = 1 << 16;
    if n < 2 || work < MIN_PARALLEL_WORK {
        f(0..n);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(n, f);
    }
}

#[cfg(test)]
mod tests {
    /// Every element lands at its row and column, ragged last chunk included, on the pool
    /// and inline.
    #[test]
    fn parallel_columns_places_every_column() {
        for (m, n, work) in [(3, 37, 1 << 20), (1, 50, 1 << 20), (5, 16, 0), (2, 1, 0)] {
            let mut out = vec![f32::NAN; m * n];
            super::parallel_columns(&mut out, m, 16, work, |c, tile| {
                for (j, column) in tile.chunks_exact_mut(m).enumerate() {
                    for (r, v) in column.iter_mut().enumerate() {
                        *v = ((c * 16 + j) * 1000 + r) as f32;
                    }
                }
            });
            for r in 0..m {
                for col in 0..n {
                    assert_eq!(out[r * n + col], (col * 1000 + r) as f32, "m={m} n={n} r={r} col={col}");
                }
            }
        }
    }
}
