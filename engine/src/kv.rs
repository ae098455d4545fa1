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
//! exactly `len` positions. It cannot be cut back: `truncate`/`fork` to fewer positions
//! drop the whole sequence, and the model recomputes (`restorable` says what is kept).
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

use crate::recurrent::{RecurrentShape, RecurrentState};

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
    pub data: Box<dyn Any + Send + Sync>,
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
}

impl Clone for SeqCache {
    fn clone(&self) -> Self {
        Self {
            shape: self.shape,
            blocks: self.blocks.clone(),
            len: self.len,
            mirror: None,
            recurrent: self.recurrent.clone(),
        }
    }
}

impl SeqCache {
    pub fn new(shape: KvShape) -> Self {
        Self { shape, blocks: Vec::new(), len: 0, mirror: None, recurrent: None }
    }

    /// The recurrent state to update in this pass, made first (zeros) for a sequence
    /// that has none and no positions. `None` for a sequence with positions but no state,
    /// which a hybrid model cannot continue.
    pub(crate) fn recurrent_mut(&mut self, shape: RecurrentShape) -> Option<&mut RecurrentState> {
        if self.recurrent.is_none() && self.len == 0 {
            self.recurrent = Some(Arc::new(RecurrentState::new(shape)));
        }
        let state = Arc::make_mut(self.recurrent.as_mut()?);
        (state.shape() == shape).then_some(state)
    }

    /// Forget everything (a hybrid model's pass that failed after writing its state).
    pub(crate) fn clear(&mut self) {
        self.truncate(0);
        self.recurrent = None;
    }

    /// How many of the first `n` positions a fork would keep: `n` (clamped to `len`),
    /// except that a sequence with recurrent state keeps all of them or none.
    pub fn restorable(&self, n: usize) -> usize {
        let n = n.min(self.len);
        match &self.recurrent {
            Some(_) if n < self.len => 0,
            _ => n,
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
    /// which cannot be cut back, nothing is kept.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        let n = if self.recurrent.take().is_some() { 0 } else { n };
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
            recurrent: if n > 0 { self.recurrent.clone() } else { None },
        }
    }

    /// Bytes of KV memory (and recurrent state) this sequence references (shared blocks
    /// counted in full).
    pub fn bytes(&self) -> usize {
        self.blocks.len() * self.shape.block_floats() * std::mem::size_of::<f16>()
            + self.recurrent.as_ref().map_or(0, |r| r.bytes())
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
        Ok(SeqCache { shape, blocks, len: n, mirror: None, recurrent: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: KvShape = KvShape { n_layers: 2, kv_dim: 4 };

    fn filled(n: usize) -> SeqCache {
        let mut c = SeqCache::new(SHAPE);
        c.reserve(n);
        for layer in 0..2 {
            let k: Vec<f32> = (0..n * 4).map(|i| (layer * 1000 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            c.write(layer, 0, &k, &v);
        }
        c.commit(n);
        c
    }

    fn key(c: &SeqCache, layer: usize, pos: usize) -> Vec<f32> {
        let (k, _) = c.block_kv(layer, pos / BLOCK_TOKENS);
        k[(pos % BLOCK_TOKENS) * 4..][..4].iter().map(|x| x.to_f32()).collect()
    }

    #[test]
    fn append_and_read_back() {
        let c = filled(70);
        assert_eq!(c.len(), 70);
        assert_eq!(c.blocks().len(), 3);
        assert_eq!(key(&c, 1, 69), vec![1276.0, 1277.0, 1278.0, 1279.0]);
        let (_, v) = c.block_kv(0, 0);
        assert_eq!(v[4].to_f32(), -4.0);
    }

    #[test]
    fn truncate_drops_blocks() {
        let mut c = filled(70);
        c.truncate(33);
        assert_eq!(c.len(), 33);
        assert_eq!(c.blocks().len(), 2);
        c.truncate(100);
        assert_eq!(c.len(), 33);
        c.truncate(0);
        assert!(c.is_empty());
        assert!(c.blocks().is_empty());
    }

    #[test]
    fn fork_shares_without_copying_then_copies_on_write() {
        let a = filled(70);
        let mut b = a.fork(40);
        assert_eq!(b.len(), 40);
        assert_eq!(b.shared_blocks(&a), 2);
        // Writing position 40 lands in the shared second block: b gets its own copy,
        // a is untouched, the first block stays shared.
        b.reserve(1);
        b.write(0, 40, &[9.0; 4], &[9.0; 4]);
        b.commit(1);
        assert_eq!(b.shared_blocks(&a), 1);
        assert_eq!(key(&b, 0, 40), vec![9.0; 4]);
        assert_eq!(key(&a, 0, 40), vec![160.0, 161.0, 162.0, 163.0]);
        assert_eq!(key(&b, 0, 39), key(&a, 0, 39));
    }

    #[test]
    fn runs_round_trip_through_from_runs() {
        let a = filled(70);
        let runs: Vec<Vec<Vec<f16>>> = (0..2)
            .flat_map(|l| (0..2).map(move |w| (l, w)))
            .map(|(l, w)| a.runs(l, w).map(<[f16]>::to_vec).collect())
            .collect();
        assert_eq!(runs[0].iter().map(Vec::len).collect::<Vec<_>>(), vec![128, 128, 24]);
        let flat: Vec<Vec<f16>> = runs.iter().map(|r| r.concat()).collect();
        let b = SeqCache::from_runs::<()>(SHAPE, 50, |layer, which, pos0, dst| {
            dst.copy_from_slice(&flat[layer * 2 + which][pos0 * 4..pos0 * 4 + dst.len()]);
            Ok(())
        })
        .unwrap();
        assert_eq!(b.len(), 50);
        for pos in [0, 31, 32, 49] {
            assert_eq!(key(&b, 1, pos), key(&a, 1, pos));
        }
        let (_, v) = b.block_kv(0, 1);
        assert_eq!(v[4].to_f32(), -(32.0 * 4.0 + 4.0));
    }

    /// A sequence with recurrent state forks whole or not at all, and truncating it to
    /// fewer positions empties it; the state is shared until a fork writes it.
    #[test]
    fn recurrent_state_is_kept_only_with_every_position() {
        let shape = RecurrentShape { layers: 2, conv: 3, ssm: 4 };
        let mut a = filled(40);
        assert_eq!(a.restorable(30), 30, "no state: any prefix");
        assert!(a.recurrent_mut(shape).is_none(), "positions without state cannot continue");
        let mut a = SeqCache::new(SHAPE);
        a.recurrent_mut(shape).expect("a fresh sequence starts from zeros").layer_mut(1).1[2] = 5.0;
        a.reserve(40);
        a.commit(40);
        assert_eq!((a.restorable(40), a.restorable(99), a.restorable(39)), (40, 40, 0));
        let mut whole = a.fork(40);
        assert_eq!((whole.len(), a.fork(39).len()), (40, 0));
        assert!(a.fork(39).recurrent_mut(shape).is_some(), "an empty fork starts afresh");
        whole.recurrent_mut(shape).expect("shared state").layer_mut(1).1[2] = 7.0;
        assert_eq!(a.recurrent_mut(shape).expect("own state").layer_mut(1).1[2], 5.0, "copied on write");
        assert!(a.recurrent_mut(RecurrentShape { layers: 1, ..shape }).is_none(), "another model's state");
        let bytes = a.bytes();
        a.truncate(39);
        assert_eq!((a.len(), a.has_recurrent()), (0, false));
        assert!(bytes > a.bytes());
    }

    #[test]
    fn fork_on_block_boundary_shares_all_full_blocks() {
        let a = filled(64);
        let mut b = a.fork(64);
        b.reserve(5);
        assert_eq!(b.shared_blocks(&a), 2);
        assert_eq!(b.blocks().len(), 3);
    }

    /// The GPU's copy back, any thread count, equals writing the same values per layer
    /// (positions starting inside a block and ending inside another).
    #[test]
    fn layers_written_at_once_equal_layer_by_layer() {
        let (pos0, n) = (45, 60);
        let val = |layer: usize, which: usize, i: usize| (layer * 10_000 + which * 5_000 + i) as f32;
        let planes: Vec<Vec<f16>> =
            (0..4).map(|p| (0..n * 4).map(|i| f16::from_f32(val(p / 2, p % 2, i))).collect()).collect();
        let mut want = filled(pos0);
        want.reserve(n);
        for layer in 0..2 {
            let f = |which: usize| (0..n * 4).map(|i| val(layer, which, i)).collect::<Vec<f32>>();
            want.write(layer, pos0, &f(0), &f(1));
        }
        want.commit(n);
        for threads in [1, 3, 8] {
            let mut got = filled(pos0);
            got.reserve(n);
            got.write_f16_layers(pos0, n, |layer, which| &planes[layer * 2 + which], threads);
            got.commit(n);
            for layer in 0..2 {
                for which in 0..2 {
                    assert!(got.runs(layer, which).eq(want.runs(layer, which)), "{threads} threads, layer {layer}");
                }
            }
        }
    }
}
