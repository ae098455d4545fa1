//! The recurrent half of a hybrid model's sequence state (qwen35's Gated DeltaNet
//! layers): per recurrent layer, the causal convolution's last inputs and the delta
//! rule's matrix state per value head — the state after exactly the sequence's committed
//! positions. It lives in the sequence's `SeqCache` beside the attention layers' KV.
//!
//! Unlike KV, it cannot be cut back to an earlier position: a sequence keeps snapshots of
//! it at a few positions (`crate::checkpoint` says which), and cutting it back restores
//! the newest snapshot at or below the cut. Sharing is by `Arc` (forks and snapshots share
//! a state; the first pass that writes copies it).

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
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    shape: RecurrentShape,
    conv: Vec<f32>,
    ssm: Vec<f32>,
}

impl RecurrentState {
    pub fn new(shape: RecurrentShape) -> Self {
        Self { shape, conv: vec![0.0; shape.layers * shape.conv], ssm: vec![0.0; shape.layers * shape.ssm] }
    }

    /// A state from its parts (a file's), if their lengths fit `shape`.
    pub fn from_parts(shape: RecurrentShape, conv: Vec<f32>, ssm: Vec<f32>) -> Option<Self> {
        (conv.len() == shape.layers * shape.conv && ssm.len() == shape.layers * shape.ssm).then_some(Self {
            shape,
            conv,
            ssm,
        })
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
        let (c, s) = (self.shape.conv, self.shape.ssm);
        (&mut self.conv[i * c..(i + 1) * c], &mut self.ssm[i * s..(i + 1) * s])
    }

    pub fn bytes(&self) -> usize {
        self.shape.bytes()
    }
}
