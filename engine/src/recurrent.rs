//! The recurrent half of a hybrid model's sequence state (qwen35's Gated DeltaNet
//! layers): per recurrent layer, the causal convolution's last inputs and the delta
//! rule's matrix state per value head — the state after exactly the sequence's committed
//! positions. It lives in the sequence's `SeqCache` beside the attention layers' KV.
//!
//! Unlike KV, it cannot be cut back to an earlier position: a sequence keeps snapshots of
//! it at a few positions (`crate::checkpoint` says which), and cutting it back restores
//! the newest snapshot at or below the cut. Sharing is by `Arc` (forks and snapshots share
//! a state; the first pass that writes copies it).

use std::sync::atomic::{AtomicU64, Ordering};

/// Floats per recurrent layer: the convolution's state and the delta rule's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecurrentShape {
    pub layers: usize,
    /// `(conv_kernel - 1) * channels`, laid out `[channel][tap]` as llama.cpp's.
    pub conv: usize,
    /// `v_heads * head_dim * head_dim`, each head's matrix transposed as ggml's
    /// `gated_delta_net` keeps it (row `j` is column `j` of the state).
    pub ssm: usize,
}

impl RecurrentShape {
    /// Bytes of one state (f32): what a hybrid model's sequence holds besides its KV,
    /// and each of its checkpoints again.
    pub fn bytes(&self) -> usize {
        self.layers * (self.conv + self.ssm) * std::mem::size_of::<f32>()
    }
}

/// One sequence's recurrent state, all layers; zeros before the first token.
///
/// Its `stamp` names these exact values: every state made, cloned or written through
/// `layer_mut` / `parts_mut` gets a new one, so a backend's device copy (the CUDA
/// backend's, beside its KV mirror) is current exactly when it was last synced with a
/// state of the same stamp. Equality ignores it.
#[derive(Debug)]
pub struct RecurrentState {
    shape: RecurrentShape,
    conv: Vec<f32>,
    ssm: Vec<f32>,
    stamp: u64,
}

/// The next `RecurrentState::stamp` (never reused in a process).
fn next_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Clone for RecurrentState {
    fn clone(&self) -> Self {
        Self { shape: self.shape, conv: self.conv.clone(), ssm: self.ssm.clone(), stamp: next_stamp() }
    }
}

impl PartialEq for RecurrentState {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.conv == other.conv && self.ssm == other.ssm
    }
}

impl RecurrentState {
    pub fn new(shape: RecurrentShape) -> Self {
        let (conv, ssm) = (vec![0.0; shape.layers * shape.conv], vec![0.0; shape.layers * shape.ssm]);
        Self { shape, conv, ssm, stamp: next_stamp() }
    }

    /// A state from its parts (a file's), if their lengths fit `shape`.
    pub fn from_parts(shape: RecurrentShape, conv: Vec<f32>, ssm: Vec<f32>) -> Option<Self> {
        (conv.len() == shape.layers * shape.conv && ssm.len() == shape.layers * shape.ssm).then_some(Self {
            shape,
            conv,
            ssm,
            stamp: next_stamp(),
        })
    }

    /// What names these values (see the type's notes).
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Every layer's convolution and delta-rule states, to overwrite (a device copy's
    /// download); the state takes a new stamp.
    pub fn parts_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.stamp = next_stamp();
        (&mut self.conv, &mut self.ssm)
    }

    /// Every layer's convolution state, `[layer][conv]`.
    pub fn conv(&self) -> &[f32] {
        &self.conv
    }

    /// Every layer's delta-rule state, `[layer][ssm]`.
    pub fn ssm(&self) -> &[f32] {
        &self.ssm
    }

    pub fn shape(&self) -> RecurrentShape {
        self.shape
    }

    /// Recurrent layer `i`'s convolution and delta-rule states, to update in place.
    pub fn layer_mut(&mut self, i: usize) -> (&mut [f32], &mut [f32]) {
        self.stamp = next_stamp();
        let (c, s) = (self.shape.conv, self.shape.ssm);
        (&mut self.conv[i * c..(i + 1) * c], &mut self.ssm[i * s..(i + 1) * s])
    }

    pub fn bytes(&self) -> usize {
        self.shape.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write or a clone names new values; equality looks at the values only.
    #[test]
    fn stamps_change_with_every_write_and_clone() {
        let mut s = RecurrentState::new(RecurrentShape { layers: 2, conv: 3, ssm: 4 });
        let first = s.stamp();
        let copy = s.clone();
        assert_ne!(copy.stamp(), first);
        assert_eq!(copy, s);
        s.layer_mut(1).0[0] = 1.0;
        assert_ne!(s.stamp(), first);
        let before = s.stamp();
        s.parts_mut();
        assert_ne!(s.stamp(), before);
        assert_ne!(copy, s);
    }
}
