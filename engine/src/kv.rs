//! The KV cache, kept outside the model: one `SeqCache` per sequence.
//!
//! Storage is paged: a sequence is a list of reference-counted blocks of `BLOCK_TOKENS`
//! positions, each block holding K and V for every layer. This is what the prompt cache,
//! the SSD tier and batching stand on:
//! - `truncate(n)` drops whole blocks past `n` (the cache is always trimmable, even for
//!   sliding-window layers, because nothing is overwritten in a ring);
//! - `fork(n)` shares the first `n` positions with another sequence by cloning block
//!   references, not data. A block is copied only when a sequence writes into a block it
//!   shares (copy-on-write of at most one partial block per fork).
//!
//! Values are stored as f16, like llama.cpp's default KV type: half the memory and
//! bandwidth of f32, and the same rounding the reference implementation applies.
//!
//! Invariant: positions `< len` are valid in every layer. The model writes positions
//! `len..len+T` during a forward pass and `commit`s them only when the pass succeeded.
//!
//! A hybrid model's sequence also carries its recurrent state (`crate::recurrent`) after
//! exactly `len` positions, and snapshots of it at some earlier positions (checkpoints,
//! `crate::checkpoint`). A state cannot be cut back: `truncate`/`fork` to `n` positions
//! keep the newest checkpoint at or below `n` (`restorable`), KV cut back to it, and
//! drop the positions after it, which the model then recomputes.
//!
//! These host blocks are always the truth. A GPU backend keeps a `Mirror` of the first
//! positions in device memory (attention reads it there) and writes every new position
//! to both; what the mirror lacks (a sequence restored from the prompt cache or the SSD
//! tier, or forked) it uploads from here before the next pass.

use std::any::Any;
use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;

use crate::error::Result;
use crate::recurrent::RecurrentState;

/// Positions per block.
pub const BLOCK_TOKENS: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvShape {
    pub n_layers: usize,
    /// K (and V) floats per position per layer: kv heads x head dim.
    pub kv_dim: usize,
}

impl KvShape {
    fn block_floats(&self) -> usize {
        self.n_layers * 2 * BLOCK_TOKENS * self.kv_dim
    }

    /// Bytes of K+V per cached position.
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * 2 * self.kv_dim * std::mem::size_of::<f16>()
    }
}

/// K and V of `BLOCK_TOKENS` positions for all layers: `[layer][k|v][slot][kv_dim]`.
#[derive(Clone)]
pub struct KvBlock {
    data: Box<[f16]>,
}

impl KvBlock {
    fn new(shape: &KvShape) -> Self {
        // Zeroed by the allocator (calloc: fresh pages come zeroed from the kernel), not
        // written value by value — `vec![f16::ZERO; n]` stores every element.
        Self { data: vec![0u16; shape.block_floats()].reinterpret_into::<f16>().into_boxed_slice() }
    }

    fn plane(&self, shape: &KvShape, layer: usize, which: usize) -> &[f16] {
        let n = BLOCK_TOKENS * shape.kv_dim;
        let start = (layer * 2 + which) * n;
        &self.data[start..start + n]
    }

    fn plane_mut(&mut self, shape: &KvShape, layer: usize, which: usize) -> &mut [f16] {
        let n = BLOCK_TOKENS * shape.kv_dim;
        let start = (layer * 2 + which) * n;
        &mut self.data[start..start + n]
    }

    /// The whole block (for persistence).
    pub fn as_slice(&self) -> &[f16] {
        &self.data
    }
}

/// A copy of a sequence's first `len` positions that a backend keeps in its own memory.
/// Not cloned with the sequence (a clone or fork starts without one); `truncate` clamps
/// `len`. The backend owns what `data` is.
pub struct Mirror {
    pub len: usize,
    pub data: Box<dyn MirrorData>,
}

/// What a backend keeps of a sequence (its `Mirror`).
pub trait MirrorData: Any + Send + Sync {
    /// Copy the sequence's live recurrent state, newer here than on the host
    /// (`SeqCache::leave_state_on_device`), into `host`.
    fn fetch_state(&mut self, host: &mut RecurrentState) -> Result<()>;
}

impl dyn MirrorData {
    /// The backend's data, if it is a `T`.
    pub fn downcast_mut<T: Any>(&mut self) -> Option<&mut T> {
        (self as &mut dyn Any).downcast_mut()
    }

    /// The backend's data, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        (self as &dyn Any).downcast_ref()
    }
}

/// One plane (a layer's K or V) of consecutive blocks: (the block's first position, its
/// slots of that plane).
type PlaneParts<'a> = Vec<(usize, &'a mut [f16])>;

pub struct SeqCache {
    shape: KvShape,
    blocks: Vec<Arc<KvBlock>>,
    len: usize,
    mirror: Option<Mirror>,
    /// A hybrid model's recurrent state after `len` positions (`None` before its first
    /// pass, and always for the other models).
    recurrent: Option<Arc<RecurrentState>>,
    /// Snapshots of the recurrent state, ascending positions `<= len` (none without a
    /// state). A snapshot at `len` is the same `Arc` as `recurrent` until a pass writes.
    checkpoints: Vec<(usize, Arc<RecurrentState>)>,
    /// The live recurrent state is newer in the mirror than in `recurrent` (`kv_state`).
    state_on_device: bool,
}

impl Clone for SeqCache {
    /// The same positions and states (without the mirror); a live recurrent state left
    /// on the device cannot be copied from here, so then the copy keeps only the positions
    /// up to the newest checkpoint (a fork).
    fn clone(&self) -> Self {
        if self.state_on_device {
            return self.fork(self.len);
        }
        Self {
            shape: self.shape,
            blocks: self.blocks.clone(),
            len: self.len,
            mirror: None,
            recurrent: self.recurrent.clone(),
            checkpoints: self.checkpoints.clone(),
            state_on_device: false,
        }
    }
}

impl SeqCache {
    pub fn new(shape: KvShape) -> Self {
        Self {
            shape,
            blocks: Vec::new(),
            len: 0,
            mirror: None,
            recurrent: None,
            checkpoints: Vec::new(),
            state_on_device: false,
        }
    }

    /// The backend's copy of this sequence, if it has one.
    pub(crate) fn mirror_mut(&mut self) -> &mut Option<Mirror> {
        &mut self.mirror
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// Number of valid (committed) positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep only the first `n` positions (no-op if `n >= len`). With recurrent state,
    /// only those up to its newest checkpoint at or below `n` (`restorable`).
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        let n = self.restorable(n);
        if self.recurrent.is_some() {
            self.recurrent = self.state_at(n);
            self.state_on_device = false;
            self.checkpoints.retain(|c| c.0 <= n);
        }
        self.len = n;
        self.blocks.truncate(n.div_ceil(BLOCK_TOKENS));
        if let Some(m) = &mut self.mirror {
            m.len = m.len.min(n);
        }
    }

    /// A new sequence sharing this one's first `n` positions (clamped to `len`; see
    /// `restorable` for a sequence with recurrent state).
    pub fn fork(&self, n: usize) -> SeqCache {
        let n = self.restorable(n);
        Self {
            shape: self.shape,
            blocks: self.blocks[..n.div_ceil(BLOCK_TOKENS)].to_vec(),
            len: n,
            mirror: None,
            recurrent: if n > 0 { self.state_at(n) } else { None },
            checkpoints: self.checkpoints.iter().filter(|c| c.0 <= n).cloned().collect(),
            state_on_device: false,
        }
    }

    /// Bytes of KV memory and recurrent states (checkpoints too) this sequence references
    /// (shared blocks and states counted in full, a checkpoint at `len` once).
    pub fn bytes(&self) -> usize {
        let live = self.recurrent.as_ref().filter(|r| !self.checkpoints.last().is_some_and(|c| Arc::ptr_eq(&c.1, r)));
        self.blocks.len() * self.shape.block_floats() * std::mem::size_of::<f16>()
            + live.map_or(0, |r| r.bytes())
            + self.checkpoints.iter().map(|c| c.1.bytes()).sum::<usize>()
    }

    /// Whether this sequence carries recurrent state (then persisting its KV alone would
    /// lose it).
    pub fn has_recurrent(&self) -> bool {
        self.recurrent.is_some()
    }

    /// How many leading blocks this sequence shares (same allocation) with `other`.
    pub fn shared_blocks(&self, other: &SeqCache) -> usize {
        self.blocks.iter().zip(&other.blocks).take_while(|(a, b)| Arc::ptr_eq(a, b)).count()
    }

    /// Make room for `extra` positions after `len` and take unique ownership of every
    /// block they fall in (copying a shared partial block once).
    pub(crate) fn reserve(&mut self, extra: usize) {
        let end = self.len + extra;
        let first = self.len / BLOCK_TOKENS;
        while self.blocks.len() < end.div_ceil(BLOCK_TOKENS) {
            self.blocks.push(Arc::new(KvBlock::new(&self.shape)));
        }
        for b in first..end.div_ceil(BLOCK_TOKENS) {
            Arc::make_mut(&mut self.blocks[b]);
        }
    }

    /// Write K and V (`[T][kv_dim]` each) for positions `pos0..pos0+T` of one layer.
    /// Those positions must have been `reserve`d.
    pub(crate) fn write(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let d = self.shape.kv_dim;
        self.write_rows(layer, pos0, k.len() / d, |t, which, dst| {
            dst.convert_from_f32_slice(&[k, v][which][t * d..][..d]);
        });
    }

    /// `write` for values already rounded to f16 (a GPU backend's copy of its K/V), every
    /// layer at once, for positions `pos0..pos0 + n` (reserved), `plane(layer, which)`
    /// holding K (`which` 0) or V (1) as `[n][kv_dim]`; the
    /// layers' planes are spread over up to `threads` threads (each plane of a block is
    /// its own slice, so they never share memory). A GPU pass's copy back is tens of MB
    /// (8B model, 512 tokens: 64 MiB) into freshly reserved blocks, whose first touch
    /// costs as much as the copy.
    pub(crate) fn write_f16_layers<'a>(
        &mut self,
        pos0: usize,
        n: usize,
        plane: impl Fn(usize, usize) -> &'a [f16] + Sync,
        threads: usize,
    ) {
        let (d, planes) = (self.shape.kv_dim, self.shape.n_layers * 2);
        let span = BLOCK_TOKENS * d;
        // Per plane (layer * 2 + which): (first position of the block, the block's plane).
        let mut per_plane: Vec<PlaneParts<'_>> = (0..planes).map(|_| Vec::new()).collect();
        let blocks = pos0 / BLOCK_TOKENS..(pos0 + n).div_ceil(BLOCK_TOKENS);
        for (b, block) in self.blocks[blocks.clone()].iter_mut().enumerate() {
            let block = Arc::get_mut(block).expect("reserve() made written blocks unique");
            for (i, chunk) in block.data.chunks_mut(span).enumerate() {
                per_plane[i].push(((blocks.start + b) * BLOCK_TOKENS, chunk));
            }
        }
        let fill = |i: usize, parts: PlaneParts<'_>| {
            let src = plane(i / 2, i % 2);
            for (first, dst) in parts {
                let (from, to) = (pos0.max(first), (pos0 + n).min(first + BLOCK_TOKENS));
                dst[(from - first) * d..(to - first) * d].copy_from_slice(&src[(from - pos0) * d..(to - pos0) * d]);
            }
        };
        let threads = threads.clamp(1, planes);
        if threads == 1 {
            per_plane.into_iter().enumerate().for_each(|(i, parts)| fill(i, parts));
            return;
        }
        let mut work: Vec<Vec<(usize, PlaneParts<'_>)>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, parts) in per_plane.into_iter().enumerate() {
            work[i % threads].push((i, parts));
        }
        std::thread::scope(|s| {
            for mine in work {
                s.spawn(|| mine.into_iter().for_each(|(i, parts)| fill(i, parts)));
            }
        });
    }

    /// `put(t, which, dst)` fills K (`which` 0) or V (1) of position `pos0 + t`.
    fn write_rows(&mut self, layer: usize, pos0: usize, n: usize, mut put: impl FnMut(usize, usize, &mut [f16])) {
        let d = self.shape.kv_dim;
        let shape = self.shape;
        for t in 0..n {
            let pos = pos0 + t;
            let block =
                Arc::get_mut(&mut self.blocks[pos / BLOCK_TOKENS]).expect("reserve() made written blocks unique");
            let slot = (pos % BLOCK_TOKENS) * d;
            for which in 0..2 {
                put(t, which, &mut block.plane_mut(&shape, layer, which)[slot..slot + d]);
            }
        }
    }

    /// Mark `n` written positions valid.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.len <= self.blocks.len() * BLOCK_TOKENS);
    }

    /// K and V planes (`[BLOCK_TOKENS][kv_dim]`) of block `b` for `layer`. Slots past the
    /// written positions are zeros or stale data and must not be read.
    pub(crate) fn block_kv(&self, layer: usize, b: usize) -> (&[f16], &[f16]) {
        let blk = &self.blocks[b];
        (blk.plane(&self.shape, layer, 0), blk.plane(&self.shape, layer, 1))
    }

    pub fn blocks(&self) -> &[Arc<KvBlock>] {
        &self.blocks
    }

    /// K (`which` 0) or V (1) of one layer for positions `0..len`, as contiguous runs of
    /// `[positions][kv_dim]`, one per block (for persistence).
    pub fn runs(&self, layer: usize, which: usize) -> impl Iterator<Item = &[f16]> + '_ {
        let d = self.shape.kv_dim;
        self.blocks.iter().enumerate().map(move |(b, blk)| {
            let n = (self.len - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
            &blk.plane(&self.shape, layer, which)[..n * d]
        })
    }

    /// A sequence of `n` positions whose K and V come from `fill(layer, which, pos0, dst)`,
    /// which writes positions `pos0..pos0 + dst.len() / kv_dim` (the inverse of `runs`).
    pub fn from_runs<E>(
        shape: KvShape,
        n: usize,
        mut fill: impl FnMut(usize, usize, usize, &mut [f16]) -> Result<(), E>,
    ) -> Result<SeqCache, E> {
        let d = shape.kv_dim;
        let mut blocks = Vec::with_capacity(n.div_ceil(BLOCK_TOKENS));
        for b in 0..n.div_ceil(BLOCK_TOKENS) {
            let rows = (n - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let mut blk = KvBlock::new(&shape);
            for layer in 0..shape.n_layers {
                for which in 0..2 {
                    fill(layer, which, b * BLOCK_TOKENS, &mut blk.plane_mut(&shape, layer, which)[..rows * d])?;
                }
            }
            blocks.push(Arc::new(blk));
        }
        let mut c = SeqCache::new(shape);
        (c.blocks, c.len) = (blocks, n);
        Ok(c)
    }
}

#[path = "kv_state.rs"]
mod state;

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;
