//! The Gated DeltaNet layer's own ops (qwen35), one token at a time as llama.cpp's serial
//! path (`-ub 1`) computes them, op by op in ggml's CPU arithmetic:
//! - the causal convolution (`ggml_ssm_conv`): per channel an f32 FMA chain over the
//!   taps, the oldest first, through the sequence's last `taps - 1` inputs;
//! - SiLU (`ggml_silu`): ggml's vector `exp` on whole 16-wide groups, libm's on a tail;
//! - the L2 norm of each query and key head (`rms_norm` with ε/n, then × 1/√n);
//! - sigmoid and softplus element by element with libm's `expf`/`logf`;
//! - the delta rule (`ggml_gated_delta_net`, its fused CPU op): per value head, the
//!   state times `exp(g)`, `δ = (v − Sᵀk)·β`, `S += k δᵀ`, `o = Sᵀq / √d`, its dot
//!   products in `ggml_vec_dot_f32`'s AVX-512 order and its updates as FMAs.
//!
//! A token's values never depend on other sequences: a batch runs each row's tokens in
//! order against that row's own state.

use super::attention::dot_vec_f32;
use super::ops::{by_rows, expf, rms_scale};

/// One token through the causal convolution of every channel: `state` holds each
/// channel's last `taps - 1` inputs (`[channel][tap]`, oldest first) and takes `x`
/// (`[channel]`) in; `w` is `[channel][taps]`. Returns the convolution `[channel]`.
pub fn conv_step(state: &mut [f32], w: &[f32], x: &[f32], taps: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    conv_token(state, &taps_first(w, taps), x, 0, &mut out);
    conv_advance(state, x, taps);
    out
}

/// The convolution's weights `[channel][taps]` as `[tap][channel]`, `conv_token`'s layout.
pub fn taps_first(w: &[f32], taps: usize) -> Vec<f32> {
    let ch = w.len() / taps;
    (0..taps).flat_map(|i| (0..ch).map(move |c| w[c * taps + i])).collect()
}

/// Token `j` of a run of tokens through the causal convolution, the state left as it
/// was before the run: `state` as `conv_step`'s, `wt` the weights `[tap][channel]`
/// (`taps_first`), `xs` the run's inputs (`[token][channel]`). Each channel's window is
/// the state's inputs followed by the run's, so a token needs only inputs, never an
/// earlier token's result: a run's tokens can be computed in any order, each channel
/// with `conv_step`'s FMA chain (oldest tap first), a tap across all channels at a time.
pub fn conv_token(state: &[f32], wt: &[f32], xs: &[f32], j: usize, out: &mut [f32]) {
    let ch = out.len();
    let keep = wt.len() / ch - 1;
    out.fill(0.0);
    for (i, w) in wt.chunks_exact(ch).enumerate() {
        let m = j + i;
        if m < keep {
            for ((o, s), &w) in out.iter_mut().zip(state.chunks_exact(keep)).zip(w) {
                *o = s[m].mul_add(w, *o);
            }
        } else {
            for ((o, &x), &w) in out.iter_mut().zip(&xs[(m - keep) * ch..(m - keep + 1) * ch]).zip(w) {
                *o = x.mul_add(w, *o);
            }
        }
    }
}

/// Advance the convolution's `state` past a run of inputs `xs` (`[token][channel]`): each
/// channel keeps its last `taps - 1` inputs, from the run or, for a short run, the state.
pub fn conv_advance(state: &mut [f32], xs: &[f32], taps: usize) {
    let keep = taps - 1;
    let ch = state.len() / keep;
    let n = xs.len() / ch;
    for (c, s) in state.chunks_exact_mut(keep).enumerate() {
        if n < keep {
            s.copy_within(n.., 0);
        }
        for (m, v) in s.iter_mut().enumerate().skip(keep.saturating_sub(n)) {
            *v = xs[(n + m - keep) * ch + c];
        }
    }
}

/// `x = silu(x)` in rows of `width` (ggml's `ggml_vec_silu_f32` per row: whole 16-wide
/// groups through its vector `exp`, the rest through libm's).
pub fn silu_rows(x: &mut [f32], width: usize) {
    for row in x.chunks_exact_mut(width) {
        let simd = width & !15;
        let (head, tail) = row.split_at_mut(simd);
        for v in head {
            *v /= 1.0 + expf(0.0 - *v);
        }
        for v in tail {
            *v /= 1.0 + (-*v).exp();
        }
    }
}

/// The L2 norm of each `width`-long head of `x`, as llama.cpp's `build_gdn_l2_norm`
/// computes it: RMSNorm with ε/width, then a scale by 1/√width.
pub fn l2_norm_heads(x: &mut [f32], width: usize, eps: f32) {
    let n = width as f32;
    let inv = 1.0 / n.sqrt();
    for head in x.chunks_exact_mut(width) {
        let scale = rms_scale(head, eps / n);
        for v in head.iter_mut() {
            *v = *v * scale * inv;
        }
    }
}

/// `l2_norm_heads` over the first `n` values of each `width`-wide row of `x` (`dims` is
/// `(width, n, head)`), rows spread over the pool.
pub fn l2_norm_rows(x: &mut [f32], (width, n, head): (usize, usize, usize), eps: f32) {
    by_rows(x, width, 4, |rows, _| {
        for row in rows.chunks_exact_mut(width) {
            l2_norm_heads(&mut row[..n], head, eps);
        }
    });
}

/// The gated RMSNorm of the layer's output: each `w`-wide row of `x` RMSNormed with `w`,
/// then times SiLU of the same row of `z` (`silu_rows`), rows spread over the pool.
pub fn gated_rms_norm(x: &mut [f32], w: &[f32], z: &[f32], eps: f32) {
    let width = w.len();
    by_rows(x, width, 8, |rows, first| {
        let mut gate = z[first * width..first * width + rows.len()].to_vec();
        silu_rows(&mut gate, width);
        for (row, gate) in rows.chunks_exact_mut(width).zip(gate.chunks_exact(width)) {
            let scale = rms_scale(row, eps);
            for ((v, g), z) in row.iter_mut().zip(w).zip(gate) {
                *v = *v * scale * g * z;
            }
        }
    });
}

/// `1 / (1 + exp(-x))` with libm's `expf` (`ggml_vec_sigmoid_f32`).
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `log(1 + exp(x))`, `x` itself above 20 (ggml's `op_softplus`).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// One token of one value head through the delta rule, in place on `state` (`d × d`,
/// row `j` holding the state's column `j`). `q` and `k` are the head's L2-normed query
/// and key, `g` its log decay, `beta` its write strength. Writes `out` (`d`).
pub struct DeltaStep<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: f32,
    pub beta: f32,
}

/// One `DeltaStep` through the delta rule, row by row in one pass over the state: a row's
/// decay, `δ_j`, update and read depend on that row alone, so this is the op's arithmetic
/// exactly, without an allocation or three more passes over the state.
pub fn delta_step(state: &mut [f32], t: &DeltaStep<'_>, out: &mut [f32]) {
    let d = t.v.len();
    let decay = t.g.exp();
    let scale = 1.0 / (d as f32).sqrt();
    for ((row, &v), o) in state.chunks_exact_mut(d).zip(t.v).zip(out.iter_mut()) {
        for s in row.iter_mut() {
            *s *= decay;
        }
        let dj = (v - dot_vec_f32(row, t.k)) * t.beta;
        for (s, &k) in row.iter_mut().zip(t.k) {
            *s = k.mul_add(dj, *s);
        }
        *o = dot_vec_f32(row, t.q) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The convolution sees the state's inputs then the new one, and keeps the newest.
    #[test]
    fn conv_slides_its_window() {
        let mut state = vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0];
        let w = vec![1.0, 0.5, 0.25, 0.125, 0.0, 0.0, 0.0, 1.0];
        let out = conv_step(&mut state, &w, &[4.0, 40.0], 4);
        assert_eq!(out, vec![1.0 + 1.0 + 0.75 + 0.5, 40.0]);
        assert_eq!(state, vec![2.0, 3.0, 4.0, 20.0, 30.0, 40.0]);
    }

    /// A run's tokens in any order (`conv_token`, then `conv_advance`) give the values
    /// and the state that `conv_step` gives token by token, runs shorter than the window
    /// included.
    #[test]
    fn conv_run_equals_steps() {
        let (ch, taps) = (3, 4);
        let w: Vec<f32> = (0..ch * taps).map(|i| (i as f32 * 0.37).sin()).collect();
        let wt = taps_first(&w, taps);
        for n in [1, 2, 5] {
            let mut serial: Vec<f32> = (0..ch * (taps - 1)).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut run = serial.clone();
            let xs: Vec<f32> = (0..ch * n).map(|i| (i as f32 * 0.73).sin() * 3.0).collect();
            let want: Vec<f32> = xs.chunks_exact(ch).flat_map(|x| conv_step(&mut serial, &w, x, taps)).collect();
            let mut got = vec![0.0; ch * n];
            for (j, o) in got.chunks_exact_mut(ch).enumerate().rev() {
                conv_token(&run, &wt, &xs, j, o);
            }
            conv_advance(&mut run, &xs, taps);
            assert_eq!((got, run), (want, serial), "run of {n}");
        }
    }

    /// With a unit key, the rule writes `v` into the state's column `k` points at
    /// (β = 1, no decay), and a query along the same key reads it back scaled by 1/√d.
    #[test]
    fn delta_rule_stores_and_recalls_a_value() {
        let d = 64;
        let mut key = vec![0.0; d];
        key[3] = 1.0;
        let v: Vec<f32> = (0..d).map(|i| i as f32 / 8.0).collect();
        let mut state = vec![0.5; d * d];
        let mut out = vec![0.0; d];
        let step = DeltaStep { q: &key, k: &key, v: &v, g: -1e30, beta: 1.0 };
        delta_step(&mut state, &step, &mut out);
        let want: Vec<f32> = v.iter().map(|x| x / 8.0).collect();
        assert_eq!(out, want);
        // A second write of the same value changes nothing: δ = v − Sᵀk = 0.
        let before = state.clone();
        delta_step(&mut state, &DeltaStep { g: 0.0, ..step }, &mut out);
        assert_eq!(state, before);
    }

    #[test]
    fn l2_norm_makes_unit_heads() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        l2_norm_heads(&mut x, 4, 1e-6);
        let norm = |h: &[f32]| h.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm(&x[..4]) - 1.0).abs() < 1e-5 && (norm(&x[4..]) - 1.0).abs() < 1e-5);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7 && softplus(30.0) == 30.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
