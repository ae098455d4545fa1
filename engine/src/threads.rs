//! Compute thread count. candle sizes its CPU worker pool (which our kernels share)
//! from `CANDLE_NUM_THREADS` when the pool is first used; default is the number of
//! physical cores. `candle_core::utils::get_num_threads` (which sizes work, e.g. when
//! attention groups a batch's rows) reads `RAYON_NUM_THREADS` instead, so both are set:
//! with `--threads 2` on a 16-core machine the two must agree. Also what that many
//! threads can read from memory (`read_bandwidth`, the bound on decode speed).

use std::time::Instant;

/// Set the compute thread count (and the heap's handling of pass buffers,
/// `crate::heap`). Call once, at startup, before any model is loaded.
pub fn init(threads: Option<usize>) {
    crate::heap::keep_freed_buffers();
    if let Some(n) = threads.filter(|&n| n > 0) {
        // SAFETY: called from `main` before any other thread exists, so nothing can read
        // the environment concurrently (the only requirement of `set_var`).
        unsafe {
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        }
    }
}

/// Bytes per second that `threads` threads read from a buffer much larger than the
/// caches (best of three passes). Here, not in the CLI, so that it is compiled as the
/// engine's kernels are (optimized: the sum loop must stream, not compute).
pub fn read_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 512 << 20;
    let words: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let chunk = words.len().div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let parts: Vec<_> =
                words.chunks(chunk).map(|c| s.spawn(move || c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))).collect();
            parts.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max(BYTES as f64 / t0.elapsed().as_secs_f64());
    }
    best
}
