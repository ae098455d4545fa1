//! Attention launches (`kernels/attention.cu`, `kernels/prefill.cu`): prefill rows take
//! query tiles (`PrefillKernel` in `kv.rs`), decode rows the one-query kernel; a decode
//! row that sees many keys takes flash-decoding (`flashdec.rs`, sm_80 and later) or,
//! without it, the one-query kernel split over several blocks a head.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::kv::{KvPlan, MAX_HEAD_DIM};
use super::ops::{ActFormat, DeviceAct};
use super::programs::{ATTENTION, PREFILL};
use crate::error::{Error, Result};
use crate::kernels::AttnSpec;

/// A decode row seeing more keys than this takes flash-decoding, or without it is split
/// (`ATT_SPLIT_MIN` in the kernel; the `above` of `flashdec.cu`).
pub(crate) const SPLIT_MIN: usize = 512;
/// Blocks a head for a split row (each at least `ATT_SPLIT_KEYS`, 256, keys; at most
/// `ATT_MAX_SPLITS`).
const SPLITS: usize = 16;

fn cuda(reason: String) -> Error {
    Error::Cuda { op: "attention", reason }
}

/// The one-query attention kernel for head dimension `hd` (a multiple of 8, at most
/// 256): instantiated for a capacity of 64, 128 or 256 dimensions, the smallest that holds it.
fn decode_kernel(hd: usize) -> &'static str {
    match hd {
        ..=64 => "attention_64",
        65..=128 => "attention_128",
        _ => "attention_256",
    }
}

/// Blocks a head for the decode rows of a pass: several when one of them may see more
/// than `SPLIT_MIN` keys (`long`: a row past that position; a window no wider than it
/// keeps every row under it). The kernels split only the rows that do, by their own
/// visible keys, so a row's result never depends on the rows beside it.
fn splits(long: bool, window: Option<usize>) -> usize {
    if long && window.is_none_or(|w| w > SPLIT_MIN) { SPLITS } else { 1 }
}

impl Gpu {
    /// Attention of the pass's queries (`[T][n_heads][head_dim]`) over their rows'
    /// mirrors for `layer` (after `kv_store`). Returns `[T][n_heads][head_dim]`.
    /// `sinks`: the device address of `spec.sinks`' copy (`SinkTables`), 0 without.
    /// With `quant` (a Q8_0 / Q8_1 activation of `[T][n_heads * head_dim]`; only for a
    /// pass of decode rows, head_dim a multiple of 32) the output is also quantized into
    /// it, exactly as `quantize` would.
    pub(crate) fn attention(
        &self,
        plan: &KvPlan,
        layer: usize,
        (q, sinks): (&CudaSlice<f32>, u64),
        spec: &AttnSpec,
        quant: Option<&mut DeviceAct>,
    ) -> Result<CudaSlice<f32>> {
        let (hd, nh, nkv) = (spec.head_dim, spec.n_heads, spec.n_kv_heads);
        if hd > MAX_HEAD_DIM || !hd.is_multiple_of(8) || nkv == 0 || nh % nkv != 0 || q.len() != plan.total * nh * hd {
            return Err(cuda(format!("unsupported shape: {nh} heads, {nkv} kv heads, head_dim {hd}")));
        }
        if spec.sinks.map(|s| s.len()) != (sinks != 0).then_some(nh) {
            let have = spec.sinks.map(|s| s.len());
            return Err(cuda(format!("sinks {have:?} on the host, device copy {sinks:#x}, for {nh} heads")));
        }
        if let Some(a) = &quant {
            let fits = plan.n_tiles == 0 && hd.is_multiple_of(32) && a.format.block() == 32;
            if !fits || a.format == ActFormat::Q8K || a.rows != plan.total || a.k != nh * hd {
                let what = format!("{:?} {}x{} for {} rows of {nh}x{hd}", a.format, a.rows, a.k, plan.total);
                return Err(cuda(format!("cannot quantize the output into {what}")));
            }
        }
        // SAFETY: f32 has no invalid bit patterns; every query token is in a tile or a
        // single, and the kernels write all n_heads * head_dim values of their tokens.
        let mut out = unsafe { self.stream.alloc::<f32>(q.len()) }.map_err(drv("alloc attention"))?;
        if plan.total == 0 {
            return Ok(out);
        }
        let window = spec.window.map_or(0, |w| w as i32);
        let (li, hi, ki, di) = (layer as i32, nh as i32, nkv as i32, hd as i32);
        // Rows with several new tokens: query tiles over keys in shared memory.
        if plan.n_tiles > 0 {
            let kernel = self.prefill_kernel(hd);
            let f = self.function(&PREFILL, kernel.name)?;
            let smem = kernel.smem;
            if smem > 48 << 10 {
                // Past the 48 KiB a launch gets without asking (up to 99 KiB on sm_86/89).
                let max = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                f.set_attribute(max, smem as i32).map_err(drv("attention shared memory"))?;
            }
            let cfg = LaunchConfig {
                grid_dim: (plan.n_tiles as u32, nh as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(q).arg(&mut out).arg(&plan.bases).arg(&plan.caps).arg(&plan.tok_row).arg(&plan.tok_pos);
            b.arg(&plan.tiles).arg(&li).arg(&hi).arg(&ki).arg(&di).arg(&spec.scale).arg(&window).arg(&sinks);
            // SAFETY: as below; every tile is (first token, count) of one row's
            // consecutive tokens, and the shared memory is what the kernel lays out.
            unsafe { b.launch(cfg) }.map_err(drv("attention_tiled"))?;
        }
        if plan.n_singles == 0 {
            return Ok(out);
        }
        let (qs, qd, qsum, with_sum) = match quant {
            Some(a) => {
                let s = &self.stream;
                let with_sum = i32::from(a.format == ActFormat::Q8_1);
                (a.qs.device_ptr_mut(s).0, a.d.device_ptr_mut(s).0, a.s.device_ptr_mut(s).0, with_sum)
            }
            None => (0, 0, 0, 0),
        };
        // Flash-decoding when a row may see more than SPLIT_MIN keys (the one-query
        // kernel, unsplit, keeps the rows that do not); else the older split.
        let flash = plan.flash && splits(plan.long, spec.window) > 1;
        let z = if flash { 1 } else { splits(plan.long, spec.window) };
        let above = if flash { SPLIT_MIN as i32 } else { i32::MAX };
        // Each split block's normalized output, max and sum: [T][n_heads][z][hd + 2].
        let mut part = if z > 1 {
            // SAFETY: f32 has no invalid bit patterns; `attention_combine` reads only the
            // splits the attention kernel wrote (the same ranges from the same positions).
            Some(unsafe { self.stream.alloc::<f32>(plan.total * nh * z * (hd + 2)) }.map_err(drv("alloc splits"))?)
        } else {
            None
        };
        let part_ptr = part.as_mut().map_or(0, |p| p.device_ptr_mut(&self.stream).0);
        let f = self.function(&ATTENTION, decode_kernel(hd))?;
        let cfg = LaunchConfig {
            grid_dim: (plan.n_singles as u32, nh as u32, z as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q).arg(&mut out).arg(&plan.bases).arg(&plan.caps).arg(&plan.tok_row).arg(&plan.tok_pos);
        b.arg(&plan.singles).arg(&li).arg(&hi).arg(&ki).arg(&di).arg(&spec.scale).arg(&window).arg(&above);
        b.arg(&sinks).arg(&qs).arg(&qd).arg(&qsum).arg(&with_sum).arg(&part_ptr);
        // SAFETY: sinks is null or holds nh values (a device copy of `spec.sinks`, checked
        // above); q and out hold total*nh*hd; every token's row mirror holds positions
        // 0..=pos for this layer (synced in plan_kv, this pass's written by kv_store);
        // a quantized output's arrays were sized for total rows of nh*hd (checked); the
        // split buffer holds total*nh*z*(hd+2) values.
        unsafe { b.launch(cfg) }.map_err(drv("attention"))?;
        if z > 1 {
            let f = self.function(&ATTENTION, "attention_combine")?;
            let cfg = LaunchConfig {
                grid_dim: (plan.n_singles as u32, nh as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let zi = z as i32;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut out).arg(&plan.tok_pos).arg(&plan.singles).arg(&hi).arg(&di).arg(&window).arg(&sinks).arg(&zi);
            b.arg(&part_ptr).arg(&qs).arg(&qd).arg(&qsum).arg(&with_sum);
            // SAFETY: as the launch above, with the same positions, window and split count.
            unsafe { b.launch(cfg) }.map_err(drv("attention_combine"))?;
        }
        drop(part);
        if flash {
            self.flash_decode(plan, (layer, q, sinks), spec, &mut out, (qs, qd, qsum, with_sum))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{SPLIT_MIN, SPLITS, decode_kernel, splits};

    #[test]
    fn decode_attention_kernel_by_head_dim() {
        let names: Vec<_> = [8, 64, 72, 128, 136, 256].into_iter().map(decode_kernel).collect();
        assert_eq!(
            names,
            ["attention_64", "attention_64", "attention_128", "attention_128", "attention_256", "attention_256"]
        );
    }

    #[test]
    fn decode_rows_split_only_past_the_threshold_and_any_window() {
        assert_eq!(splits(false, None), 1);
        assert_eq!(splits(true, None), SPLITS);
        assert_eq!(splits(true, Some(SPLIT_MIN)), 1);
        assert_eq!(splits(true, Some(SPLIT_MIN + 1)), SPLITS);
        assert_eq!(splits(false, Some(4096)), 1);
    }
}
