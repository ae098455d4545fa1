//! Compute thread count. candle sizes its CPU worker pool (which our kernels share)
//! from `CANDLE_NUM_THREADS` when the pool is first used; default is the number of
//! physical cores. `candle_core::utils::get_num_threads` (which sizes work, e.g. when
//! attention groups a batch's rows) reads `RAYON_NUM_THREADS` instead, so both are set:
//! with `--threads 2` on a 16-core machine the two must agree.

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
