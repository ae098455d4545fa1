//! Rotary position embedding as ggml computes it: per-pair angles by repeated f32
//! multiplication of the base's power, optional per-dimension frequency factors (Llama
//! 3.1's `rope_freqs`, phi3's LongRoPE), linear and YaRN context scaling (`rope_yarn`), and
//! the rotation of interleaved (llama) or NeoX (split-half) pairs.

use super::ops::by_rows;

/// Which pairs of a head's dimensions rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// (0,1), (2,3), ...: llama.cpp's "normal" mode; GGUF llama weights are permuted for it.
    Interleaved,
    /// (i, i + d/2): GPT-NeoX style, used by Gemma.
    Neox,
}

/// How a model stretches its rotary angles past the context it was trained for: ggml's
/// `rope_ext` parameters (`freq_scale`, YaRN's `ext_factor`, `attn_factor`, `beta_fast`,
/// `beta_slow` and the original context). `NONE` leaves the plain angles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    /// Angles are multiplied by this (1/factor): linear and YaRN interpolation.
    pub freq_scale: f32,
    /// YaRN's blend of interpolated and original angles (0: off, 1: YaRN).
    pub ext_factor: f32,
    /// cos and sin are multiplied by this (YaRN's attention factor).
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The context the model was trained for (YaRN's correction dimensions).
    pub n_ctx_orig: usize,
}

impl RopeScaling {
    pub const NONE: Self =
        Self { freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 0 };
}

/// The angles of one rotary table: base, scaling, and per-dimension frequency factors
/// (Llama 3's `rope_freqs`: each angle is divided by its pair's factor).
#[derive(Clone, Copy, Debug)]
pub struct RopeAngles<'a> {
    pub head_dim: usize,
    pub base: f32,
    pub scaling: RopeScaling,
    pub factors: Option<&'a [f32]>,
}

/// ggml's `ggml_rope_yarn_corr_dims`: the first and last dimension YaRN blends.
fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
    };
    let start = dim(beta_fast).floor();
    let end = dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

impl RopeScaling {
    /// YaRN's blend weight of pair `i` (its ramp times `ext_factor`; 0 with YaRN off).
    fn mix(&self, corr: [f32; 2], i: usize) -> f32 {
        if self.ext_factor == 0.0 {
            return 0.0;
        }
        let y = (i as f32 - corr[0]) / 0.001f32.max(corr[1] - corr[0]);
        (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor
    }

    /// The factor on cos and sin: the attention factor, with YaRN's magnitude term.
    fn mscale(&self) -> f32 {
        match self.ext_factor != 0.0 {
            true => self.attn_factor * 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0),
            false => self.attn_factor,
        }
    }
}

/// ggml's `rope_yarn` for pair `i`: (cos, sin) of the angle, both scaled. The blend and
/// the magnitude factor are FMAs where ggml's x86 build contracts them (its first product
/// of each sum).
fn rope_yarn(theta_extrap: f32, s: &RopeScaling, corr: [f32; 2], i: usize) -> (f32, f32) {
    let theta_interp = s.freq_scale * theta_extrap;
    let theta = match s.ext_factor != 0.0 {
        true => {
            let mix = s.mix(corr, i);
            theta_interp.mul_add(1.0 - mix, theta_extrap * mix)
        }
        false => theta_interp,
    };
    let mscale = s.mscale();
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// What a device needs to rotate by a scaled table in `RopeTable::scaled`'s steps: each
/// pair's frequency factor (`half` values, 1 without factors) then its YaRN mix (`half`
/// values), `freq_scale` and the factor on cos/sin.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTerms {
    pub pairs: Vec<f32>,
    pub freq_scale: f32,
    pub mscale: f32,
}

impl RopeAngles<'_> {
    /// The terms of a scaled table; `None` for a plain one (no scaling, no factors).
    pub fn terms(&self) -> Option<RopeTerms> {
        let s = &self.scaling;
        if *s == RopeScaling::NONE && self.factors.is_none() {
            return None;
        }
        let half = self.head_dim / 2;
        let corr = yarn_corr_dims(self.head_dim, s.n_ctx_orig, self.base, s.beta_fast, s.beta_slow);
        let mut pairs: Vec<f32> = (0..half).map(|i| self.factors.map_or(1.0, |f| f[i])).collect();
        pairs.extend((0..half).map(|i| s.mix(corr, i)));
        Some(RopeTerms { pairs, freq_scale: s.freq_scale, mscale: s.mscale() })
    }
}

/// cos/sin of every rotary angle for a run of consecutive positions.
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    pub fn new(pos0: usize, n: usize, head_dim: usize, base: f32) -> Self {
        Self::at(pos0..pos0 + n, head_dim, base)
    }

    /// Angles for rows at arbitrary positions (the rows of a batch of sequences).
    pub fn at(positions: impl Iterator<Item = usize>, head_dim: usize, base: f32) -> Self {
        let half = head_dim / 2;
        let theta_scale = base.powf(-2.0 / head_dim as f32);
        let mut cos = Vec::with_capacity(positions.size_hint().0 * half);
        let mut sin = Vec::with_capacity(positions.size_hint().0 * half);
        for p in positions {
            let mut theta = p as f32;
            for _ in 0..half {
                cos.push(theta.cos());
                sin.push(theta.sin());
                theta *= theta_scale;
            }
        }
        Self { half, cos, sin }
    }

    /// `at` with scaling and frequency factors, as ggml's `ggml_rope_cache_init`: the
    /// angle of pair `i` is `p * theta_scale^i` (by repeated multiplication), divided by
    /// `factors[i]`, then `rope_yarn`. With `RopeScaling::NONE` and no factors every
    /// value equals `at`'s (each extra step multiplies or divides by exactly 1).
    pub fn scaled(positions: impl Iterator<Item = usize>, a: &RopeAngles<'_>) -> Self {
        let half = a.head_dim / 2;
        let theta_scale = a.base.powf(-2.0 / a.head_dim as f32);
        let s = &a.scaling;
        let corr = yarn_corr_dims(a.head_dim, s.n_ctx_orig, a.base, s.beta_fast, s.beta_slow);
        let mut cos = Vec::with_capacity(positions.size_hint().0 * half);
        let mut sin = Vec::with_capacity(positions.size_hint().0 * half);
        for p in positions {
            let mut theta = p as f32;
            for i in 0..half {
                let ff = a.factors.map_or(1.0, |f| f[i]);
                let (c, sn) = rope_yarn(theta / ff, s, corr, i);
                cos.push(c);
                sin.push(sn);
                theta *= theta_scale;
            }
        }
        Self { half, cos, sin }
    }

    /// Rotate `x` laid out `[n][heads][head_dim]` in place.
    pub fn apply(&self, x: &mut [f32], heads: usize, style: RopeStyle) {
        self.apply_partial(x, heads, self.half * 2, style);
    }

    /// Rotate the first `2 * half` dimensions of every `head_dim`-wide head of `x`
    /// (`[n][heads][head_dim]`) and leave the rest as they are: a partial rotary embedding
    /// (qwen35 rotates 64 of 256), as ggml's rope copies the dimensions past `n_dims`.
    pub fn apply_partial(&self, x: &mut [f32], heads: usize, head_dim: usize, style: RopeStyle) {
        by_rows(x, heads * head_dim, 4, |rows, t0| self.apply_rows(rows, t0, heads * head_dim, head_dim, style));
    }

    fn apply_rows(&self, x: &mut [f32], t0: usize, width: usize, head_dim: usize, style: RopeStyle) {
        let d = self.half * 2;
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            let t = t0 + t;
            let cos = &self.cos[t * self.half..][..self.half];
            let sin = &self.sin[t * self.half..][..self.half];
            for head in row.chunks_exact_mut(head_dim) {
                let head = &mut head[..d];
                match style {
                    RopeStyle::Interleaved => {
                        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a.mul_add(cos[i], -(b * sin[i]));
                            pair[1] = a.mul_add(sin[i], b * cos[i]);
                        }
                    }
                    RopeStyle::Neox => {
                        let (lo, hi) = head.split_at_mut(self.half);
                        for i in 0..self.half {
                            let (a, b) = (lo[i], hi[i]);
                            lo[i] = a.mul_add(cos[i], -(b * sin[i]));
                            hi[i] = a.mul_add(sin[i], b * cos[i]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_position_zero_is_identity_and_preserves_norm() {
        let t = RopeTable::new(0, 2, 4, 10_000.0);
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
        t.apply(&mut x, 1, RopeStyle::Neox);
        assert_eq!(&x[..4], &[1.0, 2.0, 3.0, 4.0]);
        let n0: f32 = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v * v).sum();
        let n1: f32 = x[4..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        // Position 1, first pair rotates by exactly 1 radian.
        let mut y = vec![1.0, 0.0, 0.0, 0.0];
        RopeTable::new(1, 1, 4, 10_000.0).apply(&mut y, 1, RopeStyle::Interleaved);
        assert!((y[0] - 1f32.cos()).abs() < 1e-6 && (y[1] - 1f32.sin()).abs() < 1e-6);
    }
    /// A partial rotation turns the first dimensions of each head as a whole-head table of
    /// that size does, and leaves the others untouched.
    #[test]
    fn partial_rope_rotates_the_front_of_each_head() {
        let t = RopeTable::new(5, 1, 4, 10_000.0);
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut part = x.clone();
        t.apply_partial(&mut part, 2, 8, RopeStyle::Neox);
        for h in 0..2 {
            let mut front = x[h * 8..h * 8 + 4].to_vec();
            t.apply(&mut front, 1, RopeStyle::Neox);
            assert_eq!(&part[h * 8..h * 8 + 4], &front[..]);
            assert_eq!(&part[h * 8 + 4..h * 8 + 8], &x[h * 8 + 4..h * 8 + 8]);
        }
    }

    /// Without scaling or factors the scaled table is the plain one, bit for bit (the
    /// llama and gemma3 parity stands on it); factors divide each pair's angle; linear
    /// scaling multiplies it; YaRN scales cos/sin by its attention factor.
    #[test]
    fn scaled_rope_tables() {
        let plain = RopeTable::at(0..40, 64, 500_000.0);
        let angles = |scaling, factors| RopeAngles { head_dim: 64, base: 500_000.0, scaling, factors };
        let same = RopeTable::scaled(0..40, &angles(RopeScaling::NONE, None));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&plain.cos), bits(&same.cos));
        assert_eq!(bits(&plain.sin), bits(&same.sin));
        let ff = vec![2.0f32; 32];
        let t = RopeTable::scaled(7..8, &angles(RopeScaling::NONE, Some(&ff)));
        assert_eq!(t.cos[0], 3.5f32.cos());
        let lin = RopeScaling { freq_scale: 0.25, ..RopeScaling::NONE };
        assert_eq!(RopeTable::scaled(8..9, &angles(lin, None)).sin[0], 2f32.sin());
        let yarn = RopeScaling { freq_scale: 0.25, ext_factor: 1.0, n_ctx_orig: 4096, ..RopeScaling::NONE };
        let y = RopeTable::scaled(0..1, &angles(yarn, None));
        let m = 0.1f32.mul_add(4f32.ln(), 1.0);
        assert!(y.cos.iter().all(|&c| c == m), "position 0: cos = the magnitude factor");
    }
}
