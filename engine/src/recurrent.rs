//! The recurrent half of a hybrid model's sequence state (qwen35's Gated DeltaNet
//! layers): per recurrent layer, the causal convolution's last inputs and the delta
//! rule's matrix state per value head — the state after exactly the sequence's committed
//! positions. It lives in the sequence's `SeqCache` beside the attention layers' KV.
//!
//! Unlike KV, it cannot be cut back to an earlier position: `SeqCache` drops the whole
//! sequence when asked to (see `kv.rs`), and the model recomputes. Sharing is by `Arc`
//! (a fork of a whole cached sequence shares it; the first pass that writes copies it).

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

    pub fn shape(&self) -> RecurrentShape {
        self.shape
    }

    /// Recurrent layer `i`'s convolution and delta-rule states, to update in place.
    pub fn layer_mut(&mut self, i: usize) -> (&mut [f32], &mut [f32]) {
        let (c, s) = (self.shape.conv, self.shape.ssm);
        (&mut self.conv[i * c..(i + 1) * c], &mut self.ssm[i * s..(i + 1) * s])
    }

    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * std::mem::size_of::<f32>()
    }
}
