//! The CPU backend's Gated DeltaNet ops (qwen35), over `kernels::delta_net`: each row's
//! tokens in order against that row's own recurrent state, exactly the arithmetic the
//! model ran before it was written over `Backend` (so llama.cpp's parity holds).

use super::DeltaShape;
use super::batch::Row;
use crate::error::{Error, Result};
use crate::kernels::delta_net::{
    DeltaStep, conv_advance, conv_token, delta_step, sigmoid, silu_rows, softplus, taps_first,
};
use crate::kernels::{parallel_chunks, parallel_for};
use crate::recurrent::RecurrentState;
use std::sync::Mutex;

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
/// Token by token on the pool (a token's convolution reads inputs only), then each row's
/// state advanced past its tokens.
pub(crate) fn conv(
    spans: &[(usize, usize, usize)],
    rows: &mut [Row<'_>],
    x: &[f32],
    w: &[f32],
    s: &DeltaShape,
) -> Result<Vec<f32>> {
    let ch = s.channels();
    let mut states = Vec::with_capacity(rows.len());
    for r in rows.iter_mut() {
        states.push(state(r, s)?.layer_mut(s.slot).0);
    }
    // Each stacked token's row and its place in that row's run.
    let owner: Vec<(usize, usize)> =
        spans.iter().enumerate().flat_map(|(r, &(_, n, _))| (0..n).map(move |j| (r, j))).collect();
    let wt = taps_first(w, s.taps);
    let mut out = vec![0.0f32; x.len()];
    {
        let states: &[&mut [f32]] = &states;
        parallel_chunks(&mut out, ch, x.len() * s.taps, |t, o| {
            let (r, j) = owner[t];
            let (at, n, _) = spans[r];
            conv_token(states[r], &wt, &x[at * ch..(at + n) * ch], j, o);
            silu_rows(o, ch);
        });
    }
    for (st, &(at, n, _)) in states.iter_mut().zip(spans) {
        conv_advance(st, &x[at * ch..(at + n) * ch], s.taps);
    }
    Ok(out)
}

/// `Backend::delta_gates`.
pub(crate) fn gates(beta: &mut [f32], alpha: &mut [f32], dt_bias: &[f32], a: &[f32]) {
    beta.iter_mut().for_each(|b| *b = sigmoid(*b));
    for r in alpha.chunks_exact_mut(dt_bias.len()) {
        r.iter_mut().zip(dt_bias).zip(a).for_each(|((x, b), a)| *x = softplus(*x + b) * a);
    }
}

/// One value head of one row through its tokens: the pool's unit of `delta`'s work (the
/// heads' states and arithmetic are independent).
struct HeadRun<'a> {
    state: &'a mut [f32],
    /// The row's first stacked token and its token count.
    at: usize,
    n: usize,
    head: usize,
    /// `[token][head_dim]`.
    out: Vec<f32>,
}

/// `Backend::delta_rule`: each row's value heads in parallel on the pool, each head's
/// tokens in order through `delta_step` (its state stays in cache across the run).
pub(crate) fn delta(
    spans: &[(usize, usize, usize)],
    rows: &mut [Row<'_>],
    x: &[f32],
    (beta, decay): (&[f32], &[f32]),
    s: &DeltaShape,
) -> Result<Vec<f32>> {
    let (ch, kd, vd, vh, dh) = (s.channels(), s.key_dim(), s.value_dim(), s.v_heads, s.head_dim);
    let tokens = x.len() / ch;
    let mut runs = Vec::with_capacity(rows.len() * vh);
    for (r, &(at, n, _)) in rows.iter_mut().zip(spans) {
        let (_, ssm) = state(r, s)?.layer_mut(s.slot);
        for (head, st) in ssm.chunks_exact_mut(dh * dh).enumerate() {
            runs.push(Mutex::new(HeadRun { state: st, at, n, head, out: Vec::new() }));
        }
    }
    parallel_for(runs.len(), tokens * vh * dh * dh, |range| {
        for i in range {
            let mut run = runs[i].lock().unwrap_or_else(|e| e.into_inner());
            let HeadRun { state, at, n, head, out } = &mut *run;
            let (kh, vh0) = ((*head % s.k_heads) * dh, *head * dh);
            *out = vec![0.0f32; *n * dh];
            for (t, o) in (*at..*at + *n).zip(out.chunks_exact_mut(dh)) {
                let xt = &x[t * ch..(t + 1) * ch];
                let step = DeltaStep {
                    q: &xt[kh..kh + dh],
                    k: &xt[kd + kh..kd + kh + dh],
                    v: &xt[2 * kd + vh0..2 * kd + vh0 + dh],
                    g: decay[t * vh + *head],
                    beta: beta[t * vh + *head],
                };
                delta_step(state, &step, o);
            }
        }
    });
    let mut out = vec![0.0f32; vd * tokens];
    for run in runs {
        let run = run.into_inner().unwrap_or_else(|e| e.into_inner());
        for (t, o) in (run.at..run.at + run.n).zip(run.out.chunks_exact(dh)) {
            out[t * vd + run.head * dh..][..dh].copy_from_slice(o);
        }
    }
    Ok(out)
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
