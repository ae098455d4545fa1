//! Qwen3.5's hybrid ops (`hybrid.rs`, `kernels/hybrid.cu`) against the CPU's
//! (`kernels::delta_net`, `backend::cpu_hybrid`): the convolution and the delta rule over
//! per-row states at device addresses (two rows of different token counts in one launch,
//! each row's state its own), and the element and row ops around them.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::hybrid::StateRows;
use super::ops::RopeSpec;
use super::tests::{down, gpu, randn, rel_err, rng, up};
use crate::backend::{DeltaShape, cpu_hybrid};
use crate::kernels::delta_net::{
    DeltaStep, conv_step, delta_step, gated_rms_norm, l2_norm_heads, l2_norm_rows, silu_rows,
};
use crate::kernels::rope::{RopeStyle, RopeTable};
use crate::recurrent::{RecurrentShape, RecurrentState};

use rand::Rng;

/// FMA chains in the CPU's order; SiLU's exp is ggml's on both sides but for the tail.
const CONV_BOUND: f64 = 1e-6;
/// Dot products of `d` terms in another order (the CPU's AVX-512 lanes), through the
/// state's tokens.
const DELTA_BOUND: f64 = 1e-5;
/// f64 sums of squares in another order; libm's exp/log against CUDA's (1-2 ulp).
const ROW_BOUND: f64 = 1e-6;
const ROPE_BOUND: f64 = 1e-5;
/// A 256-term dot product in another order, through the sigmoid.
const SHARED_BOUND: f64 = 1e-5;

/// qwen35's tiny preset's delta layers: 2 key and 4 value heads of 64, 4 taps; two
/// recurrent layers, the second one's slot.
fn layer() -> DeltaShape {
    let (k_heads, v_heads, head_dim, taps) = (2, 4, 64, 4);
    let ch = (2 * k_heads + v_heads) * head_dim;
    let state = RecurrentShape { layers: 2, conv: (taps - 1) * ch, ssm: v_heads * head_dim * head_dim };
    DeltaShape { state, slot: 1, k_heads, v_heads, head_dim, taps }
}

/// Random states for `tokens.len()` rows, on the host and on the device (one buffer
/// each, laid out as the host's), with the rows' addresses and first tokens.
struct States {
    host: Vec<RecurrentState>,
    dev: Vec<CudaSlice<f32>>,
    rec: CudaSlice<u64>,
    row_first: CudaSlice<i32>,
}

impl States {
    fn new(rng: &mut rand::rngs::StdRng, s: &DeltaShape, tokens: &[usize]) -> Self {
        let g = gpu().expect("checked by the caller");
        let host: Vec<RecurrentState> = tokens
            .iter()
            .map(|_| {
                let (c, m) = (s.state.layers * s.state.conv, s.state.layers * s.state.ssm);
                RecurrentState::from_parts(s.state, randn(rng, c, 1.0), randn(rng, m, 0.2)).expect("shape")
            })
            .collect();
        let dev: Vec<CudaSlice<f32>> = host.iter().map(|h| up(g, &[h.conv(), h.ssm()].concat())).collect();
        let ptrs: Vec<u64> = dev.iter().map(|d| d.device_ptr(&g.stream).0).collect();
        let mut first = vec![0i32];
        for &n in tokens {
            first.push(first.last().copied().unwrap_or(0) + n as i32);
        }
        Self { host, rec: up(g, &ptrs), row_first: up(g, &first), dev }
    }

    fn rows(&self) -> StateRows<'_> {
        StateRows { rec: &self.rec, row_first: &self.row_first }
    }

    /// Every row's device state against its host state, layer `slot`'s part `which`
    /// (0: convolution, 1: delta rule).
    fn check(&mut self, s: &DeltaShape, which: usize, op: &str, bound: f64) {
        let g = gpu().expect("checked by the caller");
        for (i, (h, d)) in self.host.iter_mut().zip(&self.dev).enumerate() {
            let all = down(g, d);
            let n_conv = h.conv().len();
            let (conv, ssm) = h.layer_mut(s.slot);
            let (want, at) = if which == 0 {
                (conv.to_vec(), s.slot * s.state.conv)
            } else {
                (ssm.to_vec(), n_conv + s.slot * s.state.ssm)
            };
            rel_err(&format!("{op}: row {i}'s state"), &all[at..at + want.len()], &want, bound);
        }
    }
}

#[test]
fn cuda_ssm_conv_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_ssm_conv_matches_cpu");
    let s = layer();
    let ch = s.channels();
    // A prefill chunk and a decode row in one launch.
    let tokens = [5, 1];
    let mut st = States::new(&mut rng, &s, &tokens);
    let x = randn(&mut rng, 6 * ch, 2.0);
    let w = randn(&mut rng, ch * s.taps, 1.0);
    let mut want = Vec::new();
    let mut t = 0;
    for (h, &n) in st.host.iter_mut().zip(&tokens) {
        let (conv, _) = h.layer_mut(s.slot);
        for _ in 0..n {
            let mut y = conv_step(conv, &w, &x[t * ch..(t + 1) * ch], s.taps);
            silu_rows(&mut y, ch);
            want.extend(y);
            t += 1;
        }
    }
    let got = g.ssm_conv(st.rows(), &up(g, &x), &up(g, &w), &s).expect("ssm_conv");
    rel_err("ssm_conv", &down(g, &got), &want, CONV_BOUND);
    st.check(&s, 0, "ssm_conv", CONV_BOUND);
}

#[test]
fn cuda_delta_rule_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_delta_rule_matches_cpu");
    let s = layer();
    let (ch, kd, vd, vh, d) = (s.channels(), s.key_dim(), s.value_dim(), s.v_heads, s.head_dim);
    let tokens = [1, 7, 3];
    let total: usize = tokens.iter().sum();
    let mut st = States::new(&mut rng, &s, &tokens);
    let mut x = randn(&mut rng, total * ch, 1.0);
    for row in x.chunks_exact_mut(ch) {
        l2_norm_heads(&mut row[..2 * kd], d, 1e-6);
    }
    let beta: Vec<f32> = (0..total * vh).map(|_| rng.random_range(0.0..1.0)).collect();
    let decay: Vec<f32> = (0..total * vh).map(|_| rng.random_range(-3.0..0.0)).collect();
    let mut want = vec![0.0f32; total * vd];
    let mut t = 0;
    for (h, &n) in st.host.iter_mut().zip(&tokens) {
        let (_, ssm) = h.layer_mut(s.slot);
        for _ in 0..n {
            let xt = &x[t * ch..(t + 1) * ch];
            for (head, (state, o)) in ssm.chunks_exact_mut(d * d).zip(want[t * vd..].chunks_exact_mut(d)).enumerate() {
                let kh = (head % s.k_heads) * d;
                let step = DeltaStep {
                    q: &xt[kh..kh + d],
                    k: &xt[kd + kh..kd + kh + d],
                    v: &xt[2 * kd + head * d..2 * kd + (head + 1) * d],
                    g: decay[t * vh + head],
                    beta: beta[t * vh + head],
                };
                delta_step(state, &step, o);
            }
            t += 1;
        }
    }
    let got = g.delta_rule(st.rows(), &up(g, &x), (&up(g, &beta), &up(g, &decay)), &s).expect("delta_rule");
    rel_err("delta_rule", &down(g, &got), &want, DELTA_BOUND);
    st.check(&s, 1, "delta_rule", DELTA_BOUND);
}

/// The row and element ops: L2 norms of the query and key heads, the gates, the gated
/// RMSNorm, the sigmoid gate, the query/gate split (exact) and the partial rotation.
#[test]
fn cuda_hybrid_row_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_hybrid_row_ops_match_cpu");
    let s = layer();
    let (ch, kd, vh, d, t) = (s.channels(), s.key_dim(), s.v_heads, s.head_dim, 5);
    let x = randn(&mut rng, t * ch, 3.0);
    let mut want = x.clone();
    l2_norm_rows(&mut want, (ch, 2 * kd, d), 1e-6);
    let mut xd = up(g, &x);
    g.l2_norm_heads(&mut xd, (ch, 2 * kd, d), 1e-6).expect("l2_norm_heads");
    rel_err("l2_norm_heads", &down(g, &xd), &want, ROW_BOUND);

    let (beta, alpha) = (randn(&mut rng, t * vh, 6.0), randn(&mut rng, t * vh, 15.0));
    let (dt_bias, a) = (randn(&mut rng, vh, 8.0), randn(&mut rng, vh, 2.0));
    let (mut wb, mut wa) = (beta.clone(), alpha.clone());
    cpu_hybrid::gates(&mut wb, &mut wa, &dt_bias, &a);
    let (mut bd, mut ad) = (up(g, &beta), up(g, &alpha));
    g.delta_gates(&mut bd, &mut ad, &up(g, &dt_bias), &up(g, &a)).expect("delta_gates");
    rel_err("delta_gates beta", &down(g, &bd), &wb, ROW_BOUND);
    rel_err("delta_gates decay", &down(g, &ad), &wa, ROW_BOUND);

    let (o, z, w) = (randn(&mut rng, t * vh * d, 2.0), randn(&mut rng, t * vh * d, 4.0), randn(&mut rng, d, 1.5));
    let mut want = o.clone();
    gated_rms_norm(&mut want, &w, &z, 1e-6);
    let mut od = up(g, &o);
    g.gated_rms_norm(&mut od, &up(g, &w), &up(g, &z), 1e-6).expect("gated_rms_norm");
    rel_err("gated_rms_norm", &down(g, &od), &want, ROW_BOUND);

    let gate = randn(&mut rng, o.len(), 8.0);
    let mut want = o.clone();
    cpu_hybrid::sigmoid_mul(&mut want, &gate);
    let mut od = up(g, &o);
    g.sigmoid_mul(&mut od, &up(g, &gate)).expect("sigmoid_mul");
    rel_err("sigmoid_mul", &down(g, &od), &want, ROW_BOUND);

    // Gated attention's queries: 4 heads of 128, each with its gate; 32 dims rotated.
    let (heads, hd, n_rot) = (4, 128, 32);
    let qg = randn(&mut rng, t * heads * 2 * hd, 3.0);
    let (wq, wg) = cpu_hybrid::split_halves(&qg, hd);
    let (q, gd) = g.split_halves(&up(g, &qg), hd).expect("split_halves");
    assert_eq!((down(g, &q), down(g, &gd)), (wq.clone(), wg), "split_halves");
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let pos: Vec<usize> = (0..t).map(|_| rng.random_range(0..40_000)).collect();
        let mut want = wq.clone();
        RopeTable::at(pos.iter().copied(), n_rot, 1e7).apply_partial(&mut want, heads, hd, style);
        let mut qd = up(g, &wq);
        let pd = up(g, &pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
        let spec = RopeSpec { heads, head_dim: n_rot, base: 1e7, style, scaled: None };
        g.rope_partial(&mut qd, &pd, spec, hd).expect("rope_partial");
        rel_err(&format!("rope_partial {style:?}"), &down(g, &qd), &want, ROPE_BOUND);
    }
}

/// qwen35moe's shared-expert gate: y + o * sigmoid(x · w), per row (the dot product in
/// f64 here: the CPU's own order is tinyBLAS's lanes, the kernel's a block reduction).
#[test]
fn cuda_shared_gate_add_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_shared_gate_add_matches_cpu");
    let (rows, h) = (3, 256);
    let (y, o, x, w) = (
        randn(&mut rng, rows * h, 2.0),
        randn(&mut rng, rows * h, 2.0),
        randn(&mut rng, rows * h, 1.0),
        randn(&mut rng, h, 0.2),
    );
    let mut want = y.clone();
    for ((y, o), x) in want.chunks_exact_mut(h).zip(o.chunks_exact(h)).zip(x.chunks_exact(h)) {
        let dot: f64 = w.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let s = crate::kernels::delta_net::sigmoid(dot as f32);
        y.iter_mut().zip(o).for_each(|(y, &o)| *y += o * s);
    }
    let mut yd = up(g, &y);
    g.shared_gate_add(&mut yd, &up(g, &o), &up(g, &x), &up(g, &w)).expect("shared_gate_add");
    rel_err("shared_gate_add", &down(g, &yd), &want, SHARED_BOUND);
}
