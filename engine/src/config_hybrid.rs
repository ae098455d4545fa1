//! The hyperparameters of a hybrid model (qwen35: Gated DeltaNet layers between gated
//! full-attention ones), read from GGUF metadata as llama.cpp's `llama_model_qwen35`
//! reads them, and the sizes of the per-sequence state they imply. Pure: no I/O beyond
//! the metadata lookups.

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Which layers are recurrent, the Gated DeltaNet's dimensions, and the attention
/// layers' partial interleaved M-RoPE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridConfig {
    /// Per layer: a Gated DeltaNet layer (true) or a gated full-attention one.
    pub recurrent: Vec<bool>,
    /// Taps of the causal convolution (`ssm.conv_kernel`, 4).
    pub conv_kernel: usize,
    /// Size of every key and value head (`ssm.state_size`, 128).
    pub head_dim: usize,
    /// Key (and query) heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); each reads key head `h % k_heads`.
    pub v_heads: usize,
    /// Dimensions rotated at the front of every attention head (`rope.dimension_count`).
    pub n_rot: usize,
}

impl HybridConfig {
    /// As llama.cpp reads them: `attention.recurrent_layers` per layer if present, else
    /// every layer but each `full_attention_interval`-th (default 4) is recurrent. The
    /// rotary sections must cover every rotated pair with the text position (for text all
    /// of M-RoPE's sections but the fourth carry the same position, so the rotation is
    /// NeoX's over the first `n_rot` dimensions); a file that leaves pairs to the fourth
    /// section is refused.
    pub fn from_gguf(g: &Gguf, arch: &str, n_layers: usize, head_dim: usize) -> Result<Self> {
        let k = |s: &str| format!("{arch}.{s}");
        let u = |s: &str| g.u32(&k(s)).map(|v| v as usize);
        let recurrent = match g.i32_array(&k("attention.recurrent_layers")) {
            Ok(v) if v.len() >= n_layers => v[..n_layers].iter().map(|&x| x != 0).collect(),
            _ => {
                let every = g.opt_u32(&k("full_attention_interval")).unwrap_or(4).max(1) as usize;
                (0..n_layers).map(|i| (i + 1) % every != 0).collect()
            }
        };
        let cfg = Self {
            recurrent,
            conv_kernel: u("ssm.conv_kernel")?,
            head_dim: u("ssm.state_size")?,
            k_heads: u("ssm.group_count")?,
            v_heads: u("ssm.time_step_rank")?,
            n_rot: g.opt_u32(&k("rope.dimension_count")).map_or(head_dim, |v| v as usize),
        };
        let inner = u("ssm.inner_size")?;
        let bad = |key: &str| Err(Error::Metadata { key: k(key) });
        if cfg.conv_kernel < 2 || cfg.head_dim == 0 || cfg.k_heads == 0 {
            return bad("ssm.conv_kernel / state_size / group_count");
        }
        if cfg.v_heads == 0 || !cfg.v_heads.is_multiple_of(cfg.k_heads) || inner != cfg.v_heads * cfg.head_dim {
            return bad("ssm.time_step_rank / inner_size");
        }
        if cfg.n_rot == 0 || cfg.n_rot > head_dim || !cfg.n_rot.is_multiple_of(2) {
            return bad("rope.dimension_count");
        }
        let sections = g.i32_array(&k("rope.dimension_sections")).unwrap_or_default();
        if !sections_cover(&sections, cfg.n_rot / 2) {
            return Err(Error::Tensor {
                name: k("rope.dimension_sections"),
                reason: format!(
                    "M-RoPE sections {sections:?} leave some of {} rotated pairs without the text position",
                    cfg.n_rot / 2
                ),
            });
        }
        Ok(cfg)
    }

    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Floats of one layer's convolution state: the last `conv_kernel - 1` inputs.
    pub fn conv_state(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// Floats of one layer's recurrent state: a `head_dim`² matrix per value head.
    pub fn ssm_state(&self) -> usize {
        self.v_heads * self.head_dim * self.head_dim
    }

    pub fn recurrent_layers(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count()
    }
}

/// Whether ggml's interleaved M-RoPE (`ggml_mrope_cache_init`, IMROPE) gives every one of
/// `pairs` rotated pairs a text position: pair `i` (sector `i % Σsections`) takes the
/// first section's position when `i % 3 == 0` and `i < 3·s0`, the second's when `i % 3 ==
/// 1` and `i < 3·s1`, the third's when `i % 3 == 2` and `i < 3·s2`, else the fourth's —
/// which is 0 for text.
fn sections_cover(s: &[i32], pairs: usize) -> bool {
    let s: Vec<usize> = (0..4).map(|i| s.get(i).map_or(0, |&v| v.max(0) as usize)).collect();
    let total: usize = s.iter().sum();
    if total == 0 {
        return false;
    }
    (0..pairs).all(|i| {
        let sector = i % total;
        let j = sector % 3;
        sector < 3 * s[j]
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn qwen35_sections_cover_its_rotated_pairs_and_others_may_not() {
        assert!(super::sections_cover(&[11, 11, 10, 0], 32), "Qwen3.5: 64 rotated dims");
        assert!(super::sections_cover(&[6, 5, 5, 0], 16));
        assert!(!super::sections_cover(&[11, 11, 4, 6], 32), "pairs in the fourth section");
        assert!(!super::sections_cover(&[], 8));
    }
}
