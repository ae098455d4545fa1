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

pub use attention::{AttnSpec, attention};
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
