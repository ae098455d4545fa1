//! How weights meet memory. Decode reads every weight once per token, so its speed is
//! how fast the weight blocks stream in, not the arithmetic: measured on a 2-core
//! Xeon (Sapphire Rapids) VM, the Q4_1 dot loop ran 1.8 ns a block from L2 but 5.4 ns
//! a block from memory (3.8 GB/s, a quarter of what a plain read loop gets there) —
//! the hardware prefetcher alone leaves it waiting. Two remedies, neither touching the
//! arithmetic:
//! - every dot loop asks for the cache lines `AHEAD` bytes past the block it is on
//!   (2.35 ns a block from memory, 2.3x);
//! - weight storage is allocated on transparent huge pages where the kernel offers them
//!   (`madvise` mode, the default on most distributions), so the stream is not broken by
//!   a TLB miss every 4 KiB (+38 % on a plain read loop; +4 % on SmolLM2's decode, whose
//!   output matrix is the only tensor over 2 MiB; all of its weights on huge pages gave
//!   no more once the loops prefetch).

/// How far ahead of the block being multiplied its loop prefetches. Measured on the
/// Q4_1 loop (20-byte blocks) from memory: 1 KiB ahead 2.6 ns a block, 2 KiB 2.35,
/// 3 KiB 2.4; L2-resident weights are not slowed.
const AHEAD: usize = 2048;

/// Prefetch the `size_of::<T>()` bytes that lie `AHEAD` bytes past `block` (one
/// instruction per cache line; a no-op where the architecture has no stable hint).
#[inline(always)]
pub(crate) fn prefetch<T>(block: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let base = (block as *const T).cast::<i8>().wrapping_add(AHEAD);
        let mut off = 0;
        while off < size_of::<T>() {
            // SAFETY: a prefetch is a hint; it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = block;
}

/// The prefetch for a column group (decode's `super::cols`): `C` adjacent weight rows read
/// side by side, one block of each per step. Each row's own block + `AHEAD` would land
/// inside the group itself (a row is often shorter than `AHEAD`) and leave the stream's
/// real frontier unfetched — and the hardware prefetcher does poorly on many short
/// interleaved streams — so the group is treated as the one stream it is in memory,
/// consumed `C` blocks a step: step `b` asks for the lines `AHEAD` past `b` such steps
/// from the first row. Rows that are not adjacent only make the hint useless. (Measured
/// on a 2-core EPYC, Q8_0 rows of 18 blocks from memory, four columns a call: 3.9 ns a
/// block with per-row prefetches, 1.2 ns with this; Gemma 3, whose 262,144-row Q8_0
/// output matrix is most of each token, decodes 1.6x faster.)
#[inline(always)]
pub(crate) fn prefetch_group<T, const C: usize>(rows: &[&[T]; C], b: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let step = C * size_of::<T>();
        let base = rows[0].as_ptr().cast::<i8>().wrapping_add(AHEAD + b * step);
        let mut off = 0;
        while off < step {
            // SAFETY: a prefetch is a hint; it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, b);
}

/// `items` collected into storage the kernel may back with huge pages. The advice is
/// given before the first write, so the pages are huge from the start; where it is
/// refused (or the platform has none) the vector is an ordinary one.
pub(crate) fn collect_weights<T>(items: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(items.len());
    advise_huge(v.as_mut_ptr().cast(), v.capacity() * size_of::<T>());
    v.extend(items);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    // Only whole 2 MiB pages can be huge: advise the aligned interior.
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end <= start {
        return;
    }
    let Some(addr) = std::ptr::NonNull::new(start as *mut std::ffi::c_void) else { return };
    // SAFETY: [start, end) lies inside the allocation `ptr..ptr + len` that the caller
    // owns; MADV_HUGEPAGE changes how pages are backed, never their contents.
    let advised = unsafe { nix::sys::mman::madvise(addr, end - start, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
    if let Err(e) = advised {
        tracing::debug!(error = %e, bytes = end - start, "huge pages not available for weights");
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collected_weights_keep_order_and_length() {
        let n = (5 << 20) / 20 + 7; // several huge pages' worth of 20-byte blocks
        let v = collect_weights((0..n).map(|i| [i as u8; 20]));
        assert_eq!(v.len(), n);
        assert!(v.iter().enumerate().all(|(i, b)| b[0] == i as u8 && b[19] == i as u8));
        let empty: Vec<u32> = collect_weights(std::iter::empty());
        assert!(empty.is_empty());
    }

    #[test]
    fn prefetch_past_the_end_is_harmless() {
        let v = [1u64; 4];
        prefetch(&v[3]);
        prefetch(&[0u8; 300]);
    }
}
