//! The KV cache on the device: each sequence's `Mirror` (see `crate::kv`) is one f16
//! buffer `[layer][k|v][cap][kv_dim]`, grown by reallocation (then refilled from the
//! host blocks, which stay the truth). A pass's `KvPlan` tells the kernels where every
//! stacked token's row keeps its K/V; `kv_store` writes new K/V there and into a staging
//! buffer that `finish` copies back to the host cache, and `attention` reads it.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use half::f16;

use super::device::{Gpu, drv};
use super::ops::RopeSpec;
use super::programs::ATTENTION;
use crate::error::{Error, Result};
use crate::kernels::rope::RopeStyle;
use crate::kv::{BLOCK_TOKENS, Mirror, SeqCache};

/// Positions a mirror grows by at least.
const GROW: usize = 256;
/// Largest head dimension the attention kernels take.
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// Keys a tile of `attention_tiled` holds in shared memory (`KT`).
const TILE_KEYS: usize = 32;

pub(crate) struct DeviceKv {
    buf: CudaSlice<f16>,
    cap: usize,
    /// A hybrid sequence's recurrent state on the device (`recurrent.rs`).
    pub(crate) rec: Option<super::recurrent::DeviceState>,
}

/// A pass's KV layout on the host, before upload.
#[derive(Default)]
pub(crate) struct PlanHost {
    bases: Vec<u64>,
    caps: Vec<i32>,
    tok_row: Vec<i32>,
    tok_pos: Vec<i32>,
    /// Query tiles of rows with several new tokens: (first stacked token, count) pairs.
    tiles: Vec<i32>,
    /// The stacked tokens of rows with one new token (decode rows).
    singles: Vec<i32>,
    /// Each row's recurrent state on the device (0 for a sequence without one).
    rec: Vec<u64>,
    /// Each row's first stacked token, then the total.
    row_first: Vec<i32>,
    n_layers: usize,
    kv_dim: usize,
}

/// Where each stacked token's K/V goes and is read from, for one pass.
pub(crate) struct KvPlan {
    pub(crate) bases: CudaSlice<u64>,
    pub(crate) caps: CudaSlice<i32>,
    pub(crate) tok_row: CudaSlice<i32>,
    pub(crate) tok_pos: CudaSlice<i32>,
    /// `PlanHost::tiles` and `singles` (each at least one value long).
    pub(crate) tiles: CudaSlice<i32>,
    pub(crate) singles: CudaSlice<i32>,
    /// `PlanHost::rec` and `row_first`.
    pub(crate) rec: CudaSlice<u64>,
    pub(crate) row_first: CudaSlice<i32>,
    pub(crate) n_tiles: usize,
    pub(crate) n_singles: usize,
    /// `PlanHost::long`: decode attention may split rows (a different set of launches,
    /// so a captured step is only replayed for plans with the same value).
    pub(crate) long: bool,
    /// Whether decode rows past `attention::SPLIT_MIN` keys take flash-decoding
    /// (`Gpu::flash_wanted`, set at upload; tests clear it to run the older split).
    pub(crate) flash: bool,
    /// New K/V of every layer, `[layer][k|v][T][kv_dim]`, for the host cache.
    pub(crate) stage: CudaSlice<f16>,
    pub(crate) total: usize,
    pub(crate) kv_dim: usize,
}

fn cuda(op: &'static str, reason: String) -> Error {
    Error::Cuda { op, reason }
}

/// The kernel that attends rows with several new tokens (prefill), with its tile of
/// query tokens and its dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrefillKernel {
    pub(crate) name: &'static str,
    queries: usize,
    pub(crate) smem: usize,
}

impl PrefillKernel {
    /// Tensor cores (`attention_mma_*`, head_dim 64 or 128, `mma` = sm_80 or later),
    /// unless `CORRAL_CUDA_ATTENTION=simt`; else `attention_tiled_*` (f32 shared memory:
    /// Q `[qt][hd]`, K `[32][hd + 4]`, V `[32][hd]`, probabilities `[qt][32]`).
    fn choose(hd: usize, mma: bool, simt_wanted: bool) -> PrefillKernel {
        match hd {
            64 if mma && !simt_wanted => PrefillKernel { name: "attention_mma_64", queries: 64, smem: 0 },
            128 if mma && !simt_wanted => PrefillKernel { name: "attention_mma_128", queries: 64, smem: 0 },
            _ => {
                let (name, queries) = if hd <= 64 {
                    ("attention_tiled_64", 32)
                } else if hd <= 128 {
                    ("attention_tiled_128", 32)
                } else {
                    ("attention_tiled_256", 16)
                };
                let smem = (queries * hd + TILE_KEYS * (hd + 4) + TILE_KEYS * hd + queries * TILE_KEYS) * 4;
                PrefillKernel { name, queries, smem }
            }
        }
    }
}

impl PlanHost {
    /// Whether a decode row sits past `attention::SPLIT_MIN` positions (its attention
    /// may be split over several blocks a head).
    pub(crate) fn long(&self) -> bool {
        self.singles.iter().any(|&t| self.tok_pos[t as usize] as usize + 1 > super::attention::SPLIT_MIN)
    }
}

impl Gpu {
    pub(crate) fn prefill_kernel(&self, hd: usize) -> PrefillKernel {
        static SIMT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let simt = *SIMT.get_or_init(|| std::env::var("CORRAL_CUDA_ATTENTION").is_ok_and(|v| v == "simt"));
        // int8 `mma.sync` (MMQ's test) and f16 m16n8k16 both came with sm_80.
        PrefillKernel::choose(hd, self.has_mmq(), simt)
    }

    /// Make `cache`'s mirror hold its `len` positions with room for `new` more; returns
    /// the buffer's device address and capacity.
    fn sync_mirror(&self, cache: &mut SeqCache, new: usize) -> Result<(u64, usize)> {
        let shape = cache.shape();
        let (len, d) = (cache.len(), shape.kv_dim);
        let need = len + new;
        let mut mirror = cache.mirror_mut().take().filter(|m| m.data.downcast_ref::<DeviceKv>().is_some());
        let cap = mirror.as_ref().and_then(|m| m.data.downcast_ref::<DeviceKv>()).map_or(0, |k| k.cap);
        if cap < need {
            let grown = need.max(2 * cap).next_multiple_of(GROW);
            let mut buf = self.stream.alloc_zeros::<f16>(shape.n_layers * 2 * grown * d).map_err(drv("alloc KV"))?;
            // What the old mirror holds moves over on the device, one copy a layer and
            // K/V (its planes start `cap` positions apart, the new ones `grown`): a
            // re-upload from the host would cost the whole context's bytes over the bus
            // each time a sequence outgrows its mirror (the first decode step after a long
            // prompt, every doubling while one is read).
            let kept = match mirror.as_ref().map(|m| (m.len.min(len), m.data.downcast_ref::<DeviceKv>())) {
                Some((n, Some(old))) if n > 0 => {
                    for plane in 0..shape.n_layers * 2 {
                        let src = old.buf.slice(plane * old.cap * d..(plane * old.cap + n) * d);
                        let mut dst = buf.slice_mut(plane * grown * d..(plane * grown + n) * d);
                        self.stream.memcpy_dtod(&src, &mut dst).map_err(drv("grow KV"))?;
                    }
                    n
                }
                _ => 0,
            };
            let rec = mirror.as_mut().and_then(|m| m.data.downcast_mut::<DeviceKv>()).and_then(|k| k.rec.take());
            mirror = Some(Mirror { len: kept, data: Box::new(DeviceKv { buf, cap: grown, rec }) });
        }
        let mut m = mirror.unwrap_or_else(|| unreachable!("made above"));
        let from = m.len.min(len);
        let kv = m.data.downcast_mut::<DeviceKv>().unwrap_or_else(|| unreachable!("checked above"));
        if from < len {
            let mut host = vec![f16::ZERO; (len - from) * d];
            for layer in 0..shape.n_layers {
                for which in 0..2 {
                    // Block by block; the first may start inside its block.
                    let mut pos = from;
                    while pos < len {
                        let b = pos / BLOCK_TOKENS;
                        let end = ((b + 1) * BLOCK_TOKENS).min(len);
                        let plane = if which == 0 { cache.block_kv(layer, b).0 } else { cache.block_kv(layer, b).1 };
                        let (s, e) = ((pos % BLOCK_TOKENS) * d, (end - b * BLOCK_TOKENS) * d);
                        host[(pos - from) * d..(end - from) * d].copy_from_slice(&plane[s..e]);
                        pos = end;
                    }
                    let off = ((layer * 2 + which) * kv.cap + from) * d;
                    let mut dst = kv.buf.slice_mut(off..off + host.len());
                    self.stream.memcpy_htod(&host, &mut dst).map_err(drv("upload KV"))?;
                }
            }
            tracing::debug!(positions = len - from, "KV uploaded to the device");
        }
        m.len = len;
        let (ptr, _) = kv.buf.device_ptr(&self.stream);
        let out = (ptr, kv.cap);
        *cache.mirror_mut() = Some(m);
        Ok(out)
    }

    /// Sync every row's mirror and lay out the pass: `rows` are `(cache, new tokens)`;
    /// `head_dim` sizes the query tiles of rows with several tokens (`None`: decode rows
    /// only, one token each). A row marked in `per_token` has each of its tokens
    /// attended as a decode row at its own position (a speculative verify row: then each
    /// position's attention is a decode step's, bit for bit).
    pub(crate) fn plan_host(
        &self,
        rows: &mut [(&mut SeqCache, usize)],
        head_dim: Option<usize>,
        per_token: &[bool],
    ) -> Result<PlanHost> {
        let shape = rows.first().map(|r| r.0.shape()).ok_or_else(|| cuda("plan KV", "no rows".into()))?;
        let mut h = PlanHost { n_layers: shape.n_layers, kv_dim: shape.kv_dim, ..PlanHost::default() };
        for (i, (cache, n)) in rows.iter_mut().enumerate() {
            let pos0 = cache.len();
            let (ptr, cap) = self.sync_mirror(cache, *n)?;
            h.bases.push(ptr);
            h.caps.push(i32::try_from(cap).map_err(|e| cuda("plan KV", e.to_string()))?);
            h.rec.push(self.sync_recurrent(cache)?);
            let t0 = h.tok_row.len();
            h.row_first.push(t0 as i32);
            if *n == 1 || per_token.get(i).copied().unwrap_or(false) {
                h.singles.extend((t0..t0 + *n).map(|t| t as i32));
            } else if *n > 1 {
                let qt = head_dim
                    .map(|hd| self.prefill_kernel(hd).queries)
                    .ok_or_else(|| cuda("plan KV", "a prefill row in a decode plan".into()))?;
                for first in (0..*n).step_by(qt) {
                    h.tiles.extend([(t0 + first) as i32, qt.min(*n - first) as i32]);
                }
            }
            for p in pos0..pos0 + *n {
                h.tok_row.push(i as i32);
                h.tok_pos.push(p as i32);
            }
        }
        h.row_first.push(h.tok_row.len() as i32);
        // The longest tiles (latest positions, most keys) start first.
        let pairs: Vec<[i32; 2]> = h.tiles.chunks(2).map(|p| [p[0], p[1]]).collect();
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(h.tok_pos[pairs[i][0] as usize] + pairs[i][1]));
        h.tiles = order.iter().flat_map(|&i| pairs[i]).collect();
        Ok(h)
    }

    /// `plan_host`, uploaded into new buffers.
    #[cfg(test)]
    pub(crate) fn plan_kv(&self, rows: &mut [(&mut SeqCache, usize)], head_dim: usize) -> Result<KvPlan> {
        self.plan_kv_with(rows, head_dim, &[])
    }

    /// `plan_kv` with rows attended token by token (`plan_host`'s `per_token`).
    pub(crate) fn plan_kv_with(
        &self,
        rows: &mut [(&mut SeqCache, usize)],
        head_dim: usize,
        per_token: &[bool],
    ) -> Result<KvPlan> {
        let h = self.plan_host(rows, Some(head_dim), per_token)?;
        self.upload_plan(&h)
    }

    /// A plan's buffers, filled from `h`.
    pub(crate) fn upload_plan(&self, h: &PlanHost) -> Result<KvPlan> {
        let s = &self.stream;
        let up = || drv("upload KV plan");
        let total = h.tok_row.len();
        let padded = |v: &[i32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        Ok(KvPlan {
            bases: s.clone_htod(&h.bases).map_err(up())?,
            caps: s.clone_htod(&h.caps).map_err(up())?,
            tok_row: s.clone_htod(&h.tok_row).map_err(up())?,
            tok_pos: s.clone_htod(&h.tok_pos).map_err(up())?,
            tiles: s.clone_htod(&padded(&h.tiles)).map_err(up())?,
            singles: s.clone_htod(&padded(&h.singles)).map_err(up())?,
            rec: s.clone_htod(&h.rec).map_err(up())?,
            row_first: s.clone_htod(&h.row_first).map_err(up())?,
            n_tiles: h.tiles.len() / 2,
            n_singles: h.singles.len(),
            long: h.long(),
            flash: self.flash_wanted(),
            stage: s.alloc_zeros(h.n_layers * 2 * total * h.kv_dim).map_err(up())?,
            total,
            kv_dim: h.kv_dim,
        })
    }

    /// Write `h` into `plan`'s buffers (a plan of the same rows and tokens per row).
    pub(crate) fn refill_plan(&self, plan: &mut KvPlan, h: &PlanHost) -> Result<()> {
        let same_tiles =
            h.tiles.len() / 2 == plan.n_tiles && h.singles.len() == plan.n_singles && h.long() == plan.long;
        if h.tok_row.len() != plan.total || h.bases.len() != plan.bases.len() || h.kv_dim != plan.kv_dim || !same_tiles
        {
            return Err(cuda("plan KV", "refill with another shape".into()));
        }
        let s = &self.stream;
        let up = || drv("upload KV plan");
        s.memcpy_htod(&h.bases, &mut plan.bases).map_err(up())?;
        s.memcpy_htod(&h.caps, &mut plan.caps).map_err(up())?;
        s.memcpy_htod(&h.tok_row, &mut plan.tok_row).map_err(up())?;
        s.memcpy_htod(&h.tok_pos, &mut plan.tok_pos).map_err(up())?;
        s.memcpy_htod(&h.rec, &mut plan.rec).map_err(up())?;
        s.memcpy_htod(&h.row_first, &mut plan.row_first).map_err(up())?;
        if !h.tiles.is_empty() {
            s.memcpy_htod(&h.tiles, &mut plan.tiles).map_err(up())?;
        }
        if !h.singles.is_empty() {
            s.memcpy_htod(&h.singles, &mut plan.singles).map_err(up())?;
        }
        Ok(())
    }

    /// Write the pass's new K and V (`[T][kv_dim]` f32) for `layer`.
    pub(crate) fn kv_store(
        &self,
        plan: &mut KvPlan,
        layer: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<()> {
        let (total, d) = (plan.total, plan.kv_dim);
        if k.len() != total * d || v.len() != total * d {
            return Err(cuda("kv_store", format!("K/V have {} / {} values, need {total} x {d}", k.len(), v.len())));
        }
        let f = self.function(&ATTENTION, "kv_store")?;
        let cfg = LaunchConfig {
            grid_dim: (total as u32, d.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (li, di, ti) = (layer as i32, d as i32, total as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(k).arg(v).arg(&plan.bases).arg(&plan.caps).arg(&plan.tok_row).arg(&plan.tok_pos);
        b.arg(&li).arg(&di).arg(&ti).arg(&mut plan.stage);
        // SAFETY: every token's row has a mirror of capacity > its position (plan_kv);
        // stage holds n_layers * 2 * total * d values.
        unsafe { b.launch(cfg) }.map_err(drv("kv_store"))?;
        Ok(())
    }

    /// `rope_qk` of `q` (`[T][spec.heads][head_dim]`) and `k` (`k_heads` heads) at the
    /// pass's positions, then `kv_store` of the rotated keys and `v`, in one launch.
    pub(crate) fn rope_kv_store(
        &self,
        plan: &mut KvPlan,
        layer: usize,
        (q, k, v): (&mut CudaSlice<f32>, &mut CudaSlice<f32>, &CudaSlice<f32>),
        k_heads: usize,
        spec: RopeSpec,
    ) -> Result<()> {
        let RopeSpec { heads, head_dim, style, .. } = spec;
        let (total, d) = (plan.total, plan.kv_dim);
        let ok = head_dim.is_multiple_of(2)
            && head_dim <= 2048
            && k_heads * head_dim == d
            && q.len() == total * heads * head_dim
            && k.len() == total * d
            && v.len() == total * d;
        if !ok {
            let what = format!(
                "q/k/v have {} / {} / {} values for {total} x ({heads} + {k_heads}) x {head_dim}",
                q.len(),
                k.len(),
                v.len()
            );
            return Err(cuda("rope_kv_store", what));
        }
        if total == 0 {
            return Ok(());
        }
        let (theta_scale, pairs, freq_scale, mscale) = spec.angle_args();
        let half = head_dim / 2;
        let f = self.function(&ATTENTION, "rope_kv_store")?;
        let cfg = LaunchConfig {
            grid_dim: (total as u32, (heads + k_heads) as u32, 1),
            block_dim: (half.div_ceil(32) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (li, hq, hk, hf) = (layer as i32, heads as i32, k_heads as i32, half as i32);
        let (neox, ti) = (i32::from(style == RopeStyle::Neox), total as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(q).arg(k).arg(v).arg(&plan.bases).arg(&plan.caps).arg(&plan.tok_row).arg(&plan.tok_pos);
        b.arg(&li).arg(&hq).arg(&hk).arg(&hf).arg(&theta_scale).arg(&pairs).arg(&freq_scale).arg(&mscale);
        b.arg(&neox).arg(&ti).arg(&mut plan.stage);
        // SAFETY: shapes checked above; every token's row has a mirror of capacity > its
        // position (plan_kv); stage holds n_layers * 2 * total * d values; pairs is null or
        // holds head_dim values (`RopeAngles::terms`).
        unsafe { b.launch(cfg) }.map_err(drv("rope_kv_store"))?;
        Ok(())
    }

    /// Rows `src` of `x` (`[*][width]`), gathered into `[src.len()][width]`.
    pub(crate) fn gather_rows(&self, x: &CudaSlice<f32>, src: &[usize], width: usize) -> Result<CudaSlice<f32>> {
        let mut out = self.stream.alloc_zeros::<f32>(src.len() * width).map_err(drv("alloc gather"))?;
        if src.is_empty() {
            return Ok(out);
        }
        if src.iter().any(|&r| (r + 1) * width > x.len()) {
            return Err(cuda("gather_rows", "row out of range".into()));
        }
        let idx: Vec<i32> = src.iter().map(|&r| r as i32).collect();
        let idx = self.stream.clone_htod(&idx).map_err(drv("upload gather"))?;
        let f = self.function(&ATTENTION, "gather_rows")?;
        let cfg = LaunchConfig { grid_dim: (src.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let wi = width as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&idx).arg(&mut out).arg(&wi);
        // SAFETY: every index is a row of x (checked); out holds src.len() rows.
        unsafe { b.launch(cfg) }.map_err(drv("gather_rows"))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::PrefillKernel;

    #[test]
    fn prefill_attention_kernel_by_head_dim_and_device() {
        let name = |hd, mma, simt| PrefillKernel::choose(hd, mma, simt).name;
        assert_eq!((name(64, true, false), name(128, true, false)), ("attention_mma_64", "attention_mma_128"));
        assert_eq!((name(128, false, false), name(128, true, true)), ("attention_tiled_128", "attention_tiled_128"));
        assert_eq!((name(96, true, false), name(256, true, false)), ("attention_tiled_128", "attention_tiled_256"));
        // The SIMT kernel's shared memory: 53,760 bytes at head_dim 128 (over the 48 KiB
        // a launch gets without asking), 84,480 at 256.
        assert_eq!(PrefillKernel::choose(128, false, false).smem, 53_760);
        assert_eq!(PrefillKernel::choose(256, true, false).smem, 84_480);
        assert_eq!(PrefillKernel::choose(64, true, false).queries, 64);
    }
}
