//! How the process heap treats the engine's short-lived buffers.
//!
//! A forward pass allocates its activations fresh (a prefill chunk's are megabytes:
//! SmolLM2's FFN output for 512 rows is 3 MiB) and frees them a moment later. glibc
//! serves such sizes with `mmap` or trims them off the top of the heap when freed, so
//! every pass paid for page faults and the kernel's zeroing of fresh pages (~5 % of
//! SmolLM2's prefill samples in `clear_page_erms`, `exc_page_fault` and `memset`).
//! Keeping blocks up to 32 MiB on the heap and trimming only past 64 MiB of free top
//! lets the next pass reuse the same pages: SmolLM2 pp512 +~10 % on 2 cores (12-04).
//! The cost is that up to 64 MiB of freed heap stays mapped after a burst of work.
//! Large allocations (weights, the KV cache) are unaffected.

/// Tune glibc's allocator as above. Call once, at startup, before the model loads;
/// elsewhere (another C library, another OS) it does nothing.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc's <malloc.h>.
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: `mallopt` only changes allocator parameters; both values are in the
        // ranges glibc accepts (the mmap threshold's maximum is 32 MiB on 64-bit).
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 64 << 20);
        }
    }
}
