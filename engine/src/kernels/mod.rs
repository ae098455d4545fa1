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
pub mod delta_net;
mod lanes;
mod linear;
pub(crate) mod moe;
pub mod ops;
pub(crate) mod quant;
pub mod rope;

pub use attention::{AttnSpec, attention, attention_batch};
pub(crate) use linear::forward_each;
pub use linear::{Embedding, Linear, forward_many};
pub(crate) use quant::Src;

/// The instructions the CPU's quantized kernels run on this machine (`avx2`,
/// `avx2+avx512-vnni`, `portable`), for benchmarks and logs.
pub fn cpu_isa() -> &'static str {
    quant::isa::describe()
}

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

/// Fill each of `outs` (`[ms[i], n_i]`, row-major) a chunk of `cols` columns at a time,
/// all in one pool call: `f(i, c, tile)` computes columns `c * cols ..` of output `i`
/// (fewer in its last chunk: `width` of them) into `tile`, laid out `[row][width]`, whose
/// rows are then copied into place. Matmul kernels go column by column over a
/// cache-resident tile, each dot written to its row, and several matrices (on one input,
/// or each on rows of its own: a mixture's experts) share one barrier.
pub(crate) fn parallel_columns_many(
    outs: &mut [&mut [f32]],
    ms: &[usize],
    cols: usize,
    work: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    /// The chunk width the matmuls use.
    const FIXED: usize = 16;
    /// An output's base, width and rows, shared by the tasks; each writes only its own
    /// columns.
    struct Out(*mut f32, usize, usize);
    // SAFETY: tasks write disjoint elements (see below), so sharing the pointers is sound.
    unsafe impl Sync for Out {}
    debug_assert_eq!(outs.len(), ms.len());
    let bases: Vec<Out> = outs
        .iter_mut()
        .zip(ms)
        .map(|(o, &m)| {
            let n = o.len() / m.max(1);
            debug_assert_eq!(n * m, o.len());
            Out(o.as_mut_ptr(), if m == 0 { 0 } else { n }, m)
        })
        .collect();
    // Global chunk index -> (output, its chunk).
    let chunks: Vec<(usize, usize)> =
        bases.iter().enumerate().flat_map(|(i, b)| (0..b.1.div_ceil(cols)).map(move |c| (i, c))).collect();
    let most = ms.iter().copied().max().unwrap_or(0);
    parallel_for(chunks.len(), work, |range| {
        let mut tile = vec![0.0f32; cols * most];
        for g in range {
            let (i, c) = chunks[g];
            let Out(base, n, m) = bases[i];
            let first = c * cols;
            let width = cols.min(n - first);
            let tile = &mut tile[..width * m];
            f(i, c, tile);
            // SAFETY (both loops): `r < m` and `first + width <= n`, so the span is inside
            // output `i`, which outlives this call; chunk `(i, c)` is handed to exactly
            // one task and owns columns `first..first + width` of output `i`, so no
            // element is written twice or read while written.
            if width == FIXED {
                // A whole chunk's row as one fixed-size copy (a few vector moves, where a
                // `memmove` call per 64 bytes cost 4 % of a prefill).
                for (r, row) in tile.chunks_exact(FIXED).enumerate() {
                    let row: &[f32; FIXED] = row.try_into().expect("FIXED values");
                    unsafe { base.add(r * n + first).cast::<[f32; FIXED]>().write_unaligned(*row) };
                }
            } else {
                for (r, row) in tile.chunks_exact(width).enumerate() {
                    unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), base.add(r * n + first), width) };
                }
            }
        }
    });
}

thread_local! {
    /// Whether this thread is running a `parallel_for` as the pool's caller.
    static CALLING_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` over `0..n` items on candle's CPU worker pool (the one its matmuls use, so
/// our kernels never compete with spinning matmul workers), or inline when the work is
/// too small to pay for waking the pool, or when this is a task of a pool call already
/// (a matmul's task quantizing its activations: the pool's workers run nested calls
/// inline themselves; the calling thread would wait on its own call).
pub(crate) fn parallel_for(n: usize, work: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    const MIN_PARALLEL_WORK: usize = 1 << 16;
    if n < 2 || work < MIN_PARALLEL_WORK || CALLING_POOL.with(Cell::get) {
        f(0..n);
    } else {
        /// Clears the flag however the call ends.
        struct Calling;
        impl Drop for Calling {
            fn drop(&mut self) {
                CALLING_POOL.with(|c| c.set(false));
            }
        }
        CALLING_POOL.with(|c| c.set(true));
        let _calling = Calling;
        candle_core::utils::barrier_pool().execute_chunked(n, f);
    }
}

#[cfg(test)]
mod tests {
    /// Every element of every output lands at its row and column, ragged last chunks
    /// included, on the pool and inline.
    #[test]
    fn parallel_columns_places_every_column() {
        let cases = [
            (vec![3, 3, 3], vec![37, 16, 5], 1 << 20),
            (vec![1], vec![50], 1 << 20),
            (vec![5, 5], vec![16, 1], 0),
            (vec![2], vec![1], 0),
            // Outputs of different row counts (a mixture's experts), one of none.
            (vec![7, 1, 0, 4], vec![33, 16, 16, 5], 1 << 20),
        ];
        for (ms, ns, work) in cases {
            let mut outs: Vec<Vec<f32>> = ns.iter().zip(&ms).map(|(n, m)| vec![f32::NAN; m * n]).collect();
            let mut views: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            super::parallel_columns_many(&mut views, &ms, 16, work, |i, c, tile| {
                for (r, row) in tile.chunks_exact_mut(tile.len() / ms[i]).enumerate() {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = (i * 1_000_000 + (c * 16 + j) * 1000 + r) as f32;
                    }
                }
            });
            for (i, ((out, &n), &m)) in outs.iter().zip(&ns).zip(&ms).enumerate() {
                for r in 0..m {
                    for col in 0..n {
                        let want = (i * 1_000_000 + col * 1000 + r) as f32;
                        assert_eq!(out[r * n + col], want, "m={m} out {i} n={n} r={r} col={col}");
                    }
                }
            }
        }
    }
}
