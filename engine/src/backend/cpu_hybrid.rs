//! The CPU backend's Gated DeltaNet ops (qwen35), over `kernels::delta_net`: each row's
//! tokens in order against that row's own recurrent state, exactly the arithmetic the
//! model ran before it was written over `Backend` (so llama.cpp's parity holds).

use super::DeltaShape;
use super::batch::Row;
use crate::error::{Error, Result};
use crate::kernels::delta_net::{DeltaStep, conv_step, delta_step, l2_norm_heads, sigmoid, silu_rows, softplus};
use crate::kernels::ops;
use crate::recurrent::RecurrentState;

/// A hybrid sequence with cached positions and no recurrent state cannot continue.
pub fn missing_state() -> Error {
    Error::Tensor {
        name: "recurrent state".into(),
        reason: "a hybrid (qwen35) sequence with cached positions but no recurrent state cannot continue".into(),
    }
}

fn state<'a>(r: &'a mut Row<'_>, s: &DeltaShape) -> Result<&'a mut RecurrentState> {
    r.cache.recurrent_mut(s.state).ok_or_else(missing_state)
}

/// `Backend::ssm_conv`; `spans` are the pass's `(first stacked row, tokens, position)`.
pub(crate) fn conv(
    spans: &[(usize, usize, usize)],
    rows: &mut [Row<'_>],
    x: &[f32],
    w: &[f32],
    s: &DeltaShape,
) -> Result<Vec<f32>> {
    let ch = s.channels();
    let mut out = vec![0.0f32; x.len()];
    for (r, &(at, n, _)) in rows.iter_mut().zip(spans) {
        let (conv_state, _) = state(r, s)?.layer_mut(s.slot);
        for t in at..at + n {
            let mut y = conv_step(conv_state, w, &x[t * ch..(t + 1) * ch], s.taps);
            silu_rows(&mut y, ch);
            out[t * ch..(t + 1) * ch].copy_from_slice(&y);
        }
    }
    Ok(out)
}

/// `Backend::l2_norm_heads`.
pub(crate) fn l2_norm(x: &mut [f32], (width, n, head): (usize, usize, usize), eps: f32) {
    for row in x.chunks_exact_mut(width) {
        l2_norm_heads(&mut row[..n], head, eps);
    }
}

/// `Backend::delta_gates`.
pub(crate) fn gates(beta: &mut [f32], alpha: &mut [f32], dt_bias: &[f32], a: &[f32]) {
    beta.iter_mut().for_each(|b| *b = sigmoid(*b));
    for r in alpha.chunks_exact_mut(dt_bias.len()) {
        r.iter_mut().zip(dt_bias).zip(a).for_each(|((x, b), a)| *x = softplus(*x + b) * a);
    }
}

/// `Backend::delta_rule`.
pub(crate) fn delta(
    spans: &[(usize, usize, usize)],
    rows: &mut [Row<'_>],
    x: &[f32],
    (beta, decay): (&[f32], &[f32]),
    s: &DeltaShape,
) -> Result<Vec<f32>> {
    let (ch, kd, vd, vh, dh) = (s.channels(), s.key_dim(), s.value_dim(), s.v_heads, s.head_dim);
    let mut out = vec![0.0f32; vd * x.len() / ch];
    for (r, &(at, n, _)) in rows.iter_mut().zip(spans) {
        let (_, ssm) = state(r, s)?.layer_mut(s.slot);
        for t in at..at + n {
            let xt = &x[t * ch..(t + 1) * ch];
            let (q, k, v) = (&xt[..kd], &xt[kd..2 * kd], &xt[2 * kd..]);
            let o = &mut out[t * vd..(t + 1) * vd];
            for (head, (st, o)) in ssm.chunks_exact_mut(dh * dh).zip(o.chunks_exact_mut(dh)).enumerate() {
                let kh = (head % s.k_heads) * dh;
                let step = DeltaStep {
                    q: &q[kh..kh + dh],
                    k: &k[kh..kh + dh],
                    v: &v[head * dh..(head + 1) * dh],
                    g: decay[t * vh + head],
                    beta: beta[t * vh + head],
                };
                delta_step(st, &step, o);
            }
        }
    }
    Ok(out)
}

/// `Backend::gated_rms_norm`.
pub(crate) fn gated_norm(x: &mut [f32], w: &[f32], z: &[f32], eps: f32) {
    ops::rms_norm_inplace(x, w, eps);
    let mut z = z.to_vec();
    silu_rows(&mut z, w.len());
    x.iter_mut().zip(&z).for_each(|(o, z)| *o *= z);
}

/// `Backend::split_halves`.
pub(crate) fn split_halves(x: &[f32], half: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = (Vec::with_capacity(x.len() / 2), Vec::with_capacity(x.len() / 2));
    for head in x.chunks_exact(2 * half) {
        a.extend_from_slice(&head[..half]);
        b.extend_from_slice(&head[half..]);
    }
    (a, b)
}

/// `Backend::sigmoid_mul`.
pub(crate) fn sigmoid_mul(x: &mut [f32], gate: &[f32]) {
    x.iter_mut().zip(gate).for_each(|(o, g)| *o *= sigmoid(*g));
}
