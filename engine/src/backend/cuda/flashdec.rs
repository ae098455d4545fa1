//! Flash-decoding launches (`kernels/flashdec.cu`): decode rows that see more than
//! `attention::SPLIT_MIN` keys, on sm_80 and later, take one block per (row, KV head,
//! split) serving all the query heads of that KV head, one pass over the keys, then
//! `flashdec_combine`. The split count is fixed per model and device (from the SM
//! count), so a captured decode graph stays valid as rows grow, and where a row is cut
//! depends only on its own visible keys. Rows at or under the threshold keep the
//! one-query kernel (`attention.rs`), which is launched beside this one.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::attention::SPLIT_MIN;
use super::device::{Gpu, drv};
use super::kv::KvPlan;
use super::programs::ATTENTION;
use crate::error::Result;
use crate::kernels::AttnSpec;

/// Keys a tile (`FD_KT`), query heads a block serves (`FD_ROWS`: the mma's 16 rows),
/// most splits (`FD_MAX_SPLITS`) and fewest keys a split takes (`FD_KMIN`, mirrored by
/// the tests) in the kernel.
const TILE: usize = 64;
const ROWS: usize = 16;
#[cfg(test)]
const MIN_KEYS: usize = 128;
const MAX_SPLITS: usize = 128;
/// Blocks a flash-decoding launch aims at for one row: this many per SM, so a single
/// long row fills the GPU with several blocks per SM to hide memory latency.
const BLOCKS_PER_SM: usize = 4;
/// Dynamic shared memory a launch gets without asking for more.
const DEFAULT_SMEM: usize = 48 << 10;

/// The kernel for head dimension `hd` (a multiple of 8, at most 256) and the capacity
/// it is instantiated for.
fn kernel(hd: usize) -> (&'static str, usize) {
    match hd {
        ..=64 => ("flashdec_64", 64),
        65..=128 => ("flashdec_128", 128),
        _ => ("flashdec_256", 256),
    }
}

/// Dynamic shared memory of `flashdec_<cap>`: K and V tiles and the f16 queries, rows
/// of `cap + 8` halves (the warps' f32 outputs reuse it at the end).
fn smem(cap: usize) -> usize {
    (2 * TILE + ROWS) * (cap + 8) * 2
}

/// Splits a row is cut into at most (gridDim.z), for `blocks` blocks per row and split
/// (KV heads times chunks of `ROWS` query heads) on a device with `sms` SMs.
fn splits(sms: usize, blocks: usize) -> usize {
    (BLOCKS_PER_SM * sms).div_ceil(blocks.max(1)).clamp(1, MAX_SPLITS)
}

/// The device's `fd_range`: split `z`'s keys `(first, last)` of a row whose visible keys
/// are `lo..=pos`, and how many splits have keys.
#[cfg(test)]
fn split(lo: usize, pos: usize, splits: usize, z: usize) -> (usize, usize, usize) {
    let n = pos - lo + 1;
    let ks = n.div_ceil(splits).next_multiple_of(TILE).max(MIN_KEYS);
    let a = lo + z * ks;
    (a, pos.min(a + ks - 1), n.div_ceil(ks))
}

/// A decode pass's quantized-output target (`qs`, `d`, sums, Q8_1 or not), zeros without.
pub(crate) type QuantTarget = (u64, u64, u64, i32);

impl Gpu {
    /// Whether a pass's decode rows may take flash-decoding: sm_80 or later (f16
    /// `mma.sync`), unless `CORRAL_CUDA_FLASH=0` keeps the older split kernel.
    pub(crate) fn flash_wanted(&self) -> bool {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off = *OFF.get_or_init(|| std::env::var("CORRAL_CUDA_FLASH").is_ok_and(|v| v == "0"));
        self.has_mmq() && !off
    }

    /// Raise the shared-memory limit of the kernels that need more than the default
    /// (head_dim 256), once at start: a decode step may first launch them while it is
    /// being captured.
    pub(crate) fn prepare_flash(&self) -> Result<()> {
        for hd in [64, 128, 256] {
            let (name, cap) = kernel(hd);
            if smem(cap) > DEFAULT_SMEM {
                let f = self.function(&ATTENTION, name)?;
                let max = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                f.set_attribute(max, smem(cap) as i32).map_err(drv("flash-decoding shared memory"))?;
            }
        }
        Ok(())
    }

    /// Flash-decode the plan's decode rows that see more than `SPLIT_MIN` keys into
    /// `out` (and `quant`), leaving the others as they are.
    pub(crate) fn flash_decode(
        &self,
        plan: &KvPlan,
        (layer, q, sinks): (usize, &CudaSlice<f32>, u64),
        spec: &AttnSpec,
        out: &mut CudaSlice<f32>,
        (qs, qd, qsum, with_sum): QuantTarget,
    ) -> Result<()> {
        let (hd, nh, nkv) = (spec.head_dim, spec.n_heads, spec.n_kv_heads);
        let (name, cap) = kernel(hd);
        let chunks = (nh / nkv).div_ceil(ROWS);
        let z = splits(self.sms, nkv * chunks);
        // SAFETY: f32 has no invalid bit patterns; `flashdec_combine` reads only the
        // splits `flashdec_*` wrote (the same ranges from the same positions).
        let mut part = unsafe { self.stream.alloc::<f32>(plan.n_singles * nh * z * (hd + 2)) }
            .map_err(drv("alloc flash-decoding splits"))?;
        let window = spec.window.map_or(0, |w| w as i32);
        let (li, hi, ki, di, zi, above) = (layer as i32, nh as i32, nkv as i32, hd as i32, z as i32, SPLIT_MIN as i32);
        let f = self.function(&ATTENTION, name)?;
        let cfg = LaunchConfig {
            grid_dim: (plan.n_singles as u32, (nkv * chunks) as u32, z as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem(cap) as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q).arg(&plan.bases).arg(&plan.caps).arg(&plan.tok_row).arg(&plan.tok_pos).arg(&plan.singles);
        b.arg(&li).arg(&hi).arg(&ki).arg(&di).arg(&spec.scale).arg(&window).arg(&above).arg(&mut part);
        // SAFETY: q holds total*nh*hd values (checked by `attention`); every decode row's
        // mirror holds positions 0..=pos for this layer; part holds n_singles*nh*z*(hd+2)
        // values, indexed by the decode row's place in `singles`; the shared memory is
        // what the kernel lays out (the attribute for more than 48 KiB set at start).
        unsafe { b.launch(cfg) }.map_err(drv("flashdec"))?;
        let f = self.function(&ATTENTION, "flashdec_combine")?;
        let cfg = LaunchConfig {
            grid_dim: (plan.n_singles as u32, nh as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let part_ptr = part.device_ptr_mut(&self.stream).0;
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(&plan.tok_pos).arg(&plan.singles).arg(&hi).arg(&di).arg(&window).arg(&above).arg(&sinks);
        b.arg(&zi).arg(&part_ptr).arg(&qs).arg(&qd).arg(&qsum).arg(&with_sum);
        // SAFETY: as above, with the same positions, window, threshold and split count;
        // sinks is null or holds nh values; a quantized output was sized for total rows
        // of nh*hd (checked by `attention`).
        unsafe { b.launch(cfg) }.map_err(drv("flashdec_combine"))?;
        drop(part);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_SPLITS, MIN_KEYS, ROWS, TILE, kernel, smem, split, splits};

    #[test]
    fn flash_kernel_by_head_dim_and_its_shared_memory() {
        let names: Vec<_> = [8, 64, 72, 128, 136, 256].into_iter().map(|hd| kernel(hd).0).collect();
        assert_eq!(
            names,
            ["flashdec_64", "flashdec_64", "flashdec_128", "flashdec_128", "flashdec_256", "flashdec_256"]
        );
        // The warps' f32 outputs ([4][16][cap]) fit in the tiles' space at the end.
        for cap in [64, 128, 256] {
            assert!(4 * ROWS * cap * 4 <= smem(cap), "cap {cap}");
        }
        assert_eq!((smem(64), smem(128), smem(256)), (20_736, 39_168, 76_032));
    }

    #[test]
    fn flash_split_count_from_the_sm_count() {
        // H100/H200: 132 SMs. 8B (8 KV heads of 4 query heads): 66 splits; a model with
        // one KV head is capped; 64 query heads a KV head take 4 chunks of 16.
        assert_eq!(splits(132, 8), 66);
        assert_eq!(splits(132, 1), MAX_SPLITS);
        assert_eq!(splits(132, 8 * 4), 17);
        assert_eq!(splits(132, 10_000), 1);
    }

    /// Every visible key in exactly one split, splits whole tiles of at least
    /// `MIN_KEYS` (the last may be shorter), no more than asked for, and the cut a
    /// function of the row's own keys only.
    #[test]
    fn flash_splits_cover_the_row_once() {
        for z_max in [1, 16, 66, 128] {
            for (lo, pos) in [(0, 512), (0, 600), (0, 2047), (100, 8291), (0, 32_767), (5, 70_004), (1000, 1600)] {
                let used = split(lo, pos, z_max, 0).2;
                assert!(used >= 1 && used <= z_max, "{lo}..={pos} in {z_max}: {used}");
                let mut next = lo;
                for z in 0..used {
                    let (a, b, u) = split(lo, pos, z_max, z);
                    assert_eq!((a, u), (next, used));
                    assert!(b >= a && b <= pos);
                    if z + 1 < used {
                        assert!((b - a + 1) % TILE == 0 && b - a + 1 >= MIN_KEYS);
                    }
                    next = b + 1;
                }
                assert_eq!(next, pos + 1, "{lo}..={pos} in {z_max}");
                assert!(split(lo, pos, z_max, used).0 > pos, "split {used} past the row");
            }
        }
    }
}
