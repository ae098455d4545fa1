//! The grouped MMQ (`kernels/mmq_id.cu`): a mixture of experts' long prefill chunks on
//! the tensor cores. The (token, slot) rows sorted by expert (`moe_sort`) are cut into
//! tiles of up to 64 rows of one expert (`moe_tiles`, `kernels/moe_tiles.cu`), and each
//! tile is multiplied by its expert's rows of the stacked matrix with the dense MMQ's
//! bodies (`mmq.rs`): an expert's weights are read once per 64 of its rows (the grouped
//! GEMV, `gemv_id`, reads them once per 8), and each output keeps the dense MMQ's
//! per-row arithmetic, so a row's result does not depend on the rows beside it.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::device::{Gpu, drv};
use super::formats::type_index;
use super::ops::{ActFormat, DeviceAct, int, shape};
use super::programs::{MMQ, MOE};
use super::weights::DeviceWeights;
use crate::error::{Error, Result};
use crate::gguf::Stored;

/// Activation rows a tile holds: the MMQ CTA's 64 (`mmq.cu`).
pub(crate) const TILE_ROWS: usize = 64;

/// Weight rows one CTA covers (`mmq.cu`).
const TILE_N: usize = 64;

/// `moe_tiles.cu`'s block: one thread an expert.
const TILES_THREADS: usize = 512;

/// The kernels' grid's y dimension: at most this many tile slots a launch.
const MAX_GRID_Y: usize = 65_535;

/// Grouped MMQ kernels in `KERNEL_TYPES` order; `None`: the format has no MMQ body (its
/// long chunks take `gemv_id`).
const KERNELS: [Option<&str>; 15] = [
    Some("mmq_id_q4_0"),
    Some("mmq_id_q4_1"),
    Some("mmq_id_q5_0"),
    Some("mmq_id_q8_0"),
    Some("mmq_id_q4_k"),
    Some("mmq_id_q6_k"),
    None,
    Some("mmq_id_iq4_nl"),
    None,
    None,
    None,
    None,
    None,
    None,
    Some("mmq_id_mxfp4"),
];

/// The grouped MMQ kernel for weights of `dtype`, if there is one.
fn kernel(dtype: Stored) -> Option<&'static str> {
    type_index(dtype).ok().and_then(|t| KERNELS[t])
}

/// Whether `mmq_id` has a kernel for expert stacks of `dtype`.
pub(crate) fn has_mmq_id_kernel(dtype: Stored) -> bool {
    kernel(dtype).is_some()
}

/// Tile slots enough for any routing of `pairs` rows among `experts`: every expert's
/// last tile may be partial.
pub(crate) fn max_tiles(pairs: usize, experts: usize) -> usize {
    pairs.div_ceil(TILE_ROWS) + experts.min(pairs)
}

impl Gpu {
    /// The tile table of `ids` (`pairs` routed experts, each below `experts`): `[expert,
    /// first row, rows <= 64]` per tile of the sorted order, `max_tiles` slots, the unused
    /// ones zeroed.
    pub(crate) fn moe_tiles(&self, ids: &CudaSlice<i32>, pairs: usize, experts: usize) -> Result<CudaSlice<i32>> {
        let slots = max_tiles(pairs, experts);
        shape(ids.len() >= pairs && experts <= TILES_THREADS && slots <= MAX_GRID_Y, || {
            format!("{pairs} routed rows among {experts} experts ({slots} tiles; at most {MAX_GRID_Y})")
        })?;
        // SAFETY: plain integers; the kernel writes every slot.
        let mut tiles = unsafe { self.stream.alloc::<i32>(3 * slots) }.map_err(drv("alloc moe tiles"))?;
        let f = self.function(&MOE, "moe_tiles")?;
        let (pi, ei, ti, si) = (int(pairs)?, int(experts)?, int(TILE_ROWS)?, int(slots)?);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (TILES_THREADS as u32, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&f);
        b.arg(ids).arg(&pi).arg(&ei).arg(&ti).arg(&si).arg(&mut tiles);
        // SAFETY: ids holds `pairs` experts below `experts` <= TILES_THREADS (the kernel's
        // shared counts, one thread each); tiles holds 3 * slots, enough for any routing
        // (`max_tiles`).
        unsafe { b.launch(cfg) }.map_err(drv("moe_tiles"))?;
        Ok(tiles)
    }

    /// The grouped MMQ: for each tile `[expert, first, rows]` of `tiles`,
    /// `y[first + i] = W[expert] . act[first + i]` for its rows; `w` is a stack of `n`-row
    /// matrices (with gpt-oss's stacked biases, if attached), `act` and `y` the sorted rows.
    pub(crate) fn mmq_id(
        &self,
        w: &DeviceWeights,
        n: usize,
        act: &DeviceAct,
        tiles: &CudaSlice<i32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let bad = |reason: String| Error::Cuda { op: "mmq_id", reason };
        if ActFormat::for_weights(w.dtype) != Some(act.format) || act.k != w.k {
            return Err(bad(format!("{:?} weights with {:?} activations of k {}", w.dtype, act.format, act.k)));
        }
        shape(tiles.len() / 3 <= MAX_GRID_Y, || format!("{} tiles", tiles.len() / 3))?;
        let name = kernel(w.dtype).ok_or_else(|| bad(format!("no grouped MMQ kernel for {:?}", w.dtype)))?;
        let f = self.function(&MMQ, name)?;
        // Lanes past a tile's rows or the matrix's read its last row and store nothing.
        let grid = (int(n.div_ceil(TILE_N))? as u32, int(tiles.len() / 3)? as u32);
        self.launch_grouped(&f, grid, (w, n), act, tiles, y)
    }

    /// A grouped kernel (`gemv_id_*`, `mmq_id_*`: the same arguments) on 128-thread
    /// blocks: the stack `w` of `n`-row matrices (with its stacked biases, if attached),
    /// the sorted rows `act` into `y`, by the table `[expert, first row, rows]`.
    pub(super) fn launch_grouped(
        &self,
        f: &CudaFunction,
        grid: (u32, u32),
        (w, n): (&DeviceWeights, usize),
        act: &DeviceAct,
        table: &CudaSlice<i32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        shape(act.k == w.k && y.len() >= act.rows * n && n > 0 && w.n.is_multiple_of(n), || {
            format!("{} activation rows of {} into rows of {n} of a {}-row stack, k = {}", act.rows, act.k, w.n, w.k)
        })?;
        let kb = w.k / act.format.block();
        let (ni, kbi, ki) = (int(n)?, int(kb)?, int(w.k)?);
        let cfg = LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let bias = w.bias_ptr(&self.stream);
        let a = act.rows_from(0);
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.qs).arg(&w.d).arg(&w.m).arg(&w.aux);
        a.push(&mut b);
        b.arg(y).arg(&bias).arg(&ni).arg(&kbi).arg(&ki).arg(table);
        // SAFETY: the stack holds w.n rows of kb blocks and every entry's expert names one
        // of its w.n / n matrices (the router picks among `experts`); the entries cover
        // rows below act.rows (the pairs `moe_sort` placed), and y holds act.rows * n.
        unsafe { b.launch(cfg) }.map_err(drv("grouped matmul"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    #[test]
    fn tile_slots_cover_the_worst_routing() {
        // Every expert one row past a whole tile: two tiles each.
        let (experts, per) = (8, TILE_ROWS + 1);
        let worst = experts * per.div_ceil(TILE_ROWS);
        assert!(max_tiles(experts * per, experts) >= worst);
        // One row: one tile.
        assert_eq!(max_tiles(1, 128), 2);
        assert_eq!(max_tiles(0, 128), 0);
    }

    #[test]
    fn the_real_models_expert_formats_have_grouped_kernels() {
        use GgmlDType::*;
        for t in [Stored::Ggml(Q4_0), Stored::Ggml(Q8_0), Stored::Ggml(Q4K), Stored::Ggml(Q6K), Stored::Mxfp4] {
            assert!(has_mmq_id_kernel(t), "{t:?}");
        }
        assert!(!has_mmq_id_kernel(Stored::Ggml(Q5K)));
        assert!(!has_mmq_id_kernel(Stored::Ggml(F32)));
    }
}
