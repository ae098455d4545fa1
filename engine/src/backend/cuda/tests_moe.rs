//! The mixture of experts on the device against the CPU's (`kernels::moe`), on the byte-
//! built files of its own tests: qwen3moe's Q8_0 experts, and gpt-oss's MXFP4 experts
//! with the router's and the experts' biases, top-k-then-softmax routing and SwiGLU-OAI.
//! Rows of a pass share experts and chunks of the grouped GEMV; each row's output must
//! be its own route's.

use super::moe::{DeviceExperts, ExpertMatmul};
use super::tests::{down, gpu, rel_err, up};
use crate::config::{MoeConfig, MoeKind};
use crate::kernels::moe::Experts;
use crate::kernels::moe::tests::{E, H, W, file};

/// The routes agree exactly (the router's logits are the CPU's, bit for bit); the
/// experts' sums differ in f32 order and the gated values by libm's exp against CUDA's
/// (a last-bit difference may move one int8 step of the down stack's activations).
pub(super) const MOE_BOUND: f64 = 2e-3;

#[test]
fn cuda_moe_matches_cpu() {
    let Some(g) = gpu() else { return };
    for kind in [MoeKind::Qwen3, MoeKind::GptOss] {
        let file = file(kind);
        let m = MoeConfig { experts: E, used: 2, width: W, kind, shared: None };
        let cpu = Experts::load(&file, 0, H, m).expect("CPU experts");
        let dev = DeviceExperts::load(g, &file, 0, H, m).expect("device experts");
        // 1 row (a decode step), then 37 rows: more than 8 rows of some experts (chunks).
        for rows in [1, 37] {
            let x: Vec<f32> = (0..rows * H).map(|i| ((i * 7919 % 1000) as f32 / 250.0) - 2.0).collect();
            let want = cpu.forward(&x).expect("CPU forward");
            let got = down(g, &g.moe(&up(g, &x), &dev, ExpertMatmul::Gemv).expect("moe"));
            rel_err(&format!("moe {kind:?} rows={rows}"), &got, &want, MOE_BOUND);
        }
    }
}
