//! Row ops through the CPU (`kernels::ops`) and the CUDA kernels, bounded per op (see
//! `tests.rs` for the harness).

use cudarc::driver::DevicePtr;

use super::RopeSpec;
use super::ops::ScaledRope;
use super::tests::{down, gpu, nans, randn, rel_err, rng, up};
use crate::config::AttnTemperature;
use crate::kernels::ops;
use crate::kernels::rope::{RopeAngles, RopeScaling, RopeStyle, RopeTable};

use rand::Rng;

/// f64 sum of squares and IEEE sqrt/division on both sides: only the order of the f64
/// sum differs.
const RMS_BOUND: f64 = 1e-6;
/// Device cosf/sinf are within 2 ulp of libm's.
const ROPE_BOUND: f64 = 1e-5;
/// Same polynomial exp; the ragged tail uses libm expf vs device expf (1 ulp).
const SILU_BOUND: f64 = 1e-6;
/// tanhf ulps can flip the f16 rounding of single values (1 f16 ulp, ~5e-4 relative).
const GELU_BOUND: f64 = 1e-4;

#[test]
fn cuda_rms_norm_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_rms_norm_matches_cpu");
    for (rows, width) in [(1, 576), (5, 2048), (3, 4096)] {
        let x = randn(&mut rng, rows * width, 4.0);
        let w = randn(&mut rng, width, 1.5);
        let want = ops::rms_norm(&x, &w, 1e-6);
        let mut out = nans(g, rows * width);
        g.rms_norm(&up(g, &x), &up(g, &w), &mut out, 1e-6).expect("rms_norm");
        rel_err(&format!("rms_norm rows={rows} width={width}"), &down(g, &out), &want, RMS_BOUND);
    }
}

#[test]
fn cuda_rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_rope_matches_cpu");
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        for (rows, heads, head_dim, base) in [(1, 8, 64, 10_000.0f32), (7, 3, 128, 500_000.0), (4, 2, 256, 1e6)] {
            let pos: Vec<usize> = (0..rows).map(|_| rng.random_range(0..32_768)).collect();
            let x = randn(&mut rng, rows * heads * head_dim, 3.0);
            let mut want = x.clone();
            RopeTable::at(pos.iter().copied(), head_dim, base).apply(&mut want, heads, style);
            let mut xd = up(g, &x);
            let pd = up(g, &pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
            g.rope(&mut xd, &pd, RopeSpec { heads, head_dim, base, style, scaled: None }).expect("rope");
            let op = format!("rope {style:?} rows={rows} heads={heads} d={head_dim}");
            rel_err(&op, &down(g, &xd), &want, ROPE_BOUND);
            // Queries and keys in one launch: bit for bit the two launches.
            let k = randn(&mut rng, rows * 2 * head_dim, 3.0);
            let (mut qd, mut kd, mut k_alone) = (up(g, &x), up(g, &k), up(g, &k));
            g.rope_qk((&mut qd, &mut kd), 2, &pd, RopeSpec { heads, head_dim, base, style, scaled: None })
                .expect("rope_qk");
            g.rope(&mut k_alone, &pd, RopeSpec { heads: 2, head_dim, base, style, scaled: None }).expect("rope");
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(down(g, &qd)), bits(down(g, &xd)), "{op}: rope_qk queries");
            assert_eq!(bits(down(g, &kd)), bits(down(g, &k_alone)), "{op}: rope_qk keys");
        }
    }
}

/// Scaled tables (frequency factors, linear, YaRN with its magnitude term) take the CPU's
/// `RopeTable::scaled` steps; only cosf/sinf differ.
#[test]
fn cuda_scaled_rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_scaled_rope_matches_cpu");
    let (heads, head_dim, base) = (3, 128, 1e6f32);
    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + (i % 7) as f32 * 0.75).collect();
    let yarn =
        RopeScaling { freq_scale: 0.25, ext_factor: 1.0, attn_factor: 1.19, n_ctx_orig: 4096, ..RopeScaling::NONE };
    let linear = RopeScaling { freq_scale: 0.5, ..RopeScaling::NONE };
    for (scaling, factors) in [(RopeScaling::NONE, Some(&factors[..])), (linear, None), (yarn, Some(&factors[..]))] {
        let a = RopeAngles { head_dim, base, scaling, factors };
        let terms = a.terms().expect("a scaled table");
        let pairs = up(g, &terms.pairs);
        let scaled =
            ScaledRope { pairs: pairs.device_ptr(&g.stream).0, freq_scale: terms.freq_scale, mscale: terms.mscale };
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let pos: Vec<usize> = (0..6).map(|_| rng.random_range(0..65_536)).collect();
            let x = randn(&mut rng, pos.len() * heads * head_dim, 3.0);
            let mut want = x.clone();
            RopeTable::scaled(pos.iter().copied(), &a).apply(&mut want, heads, style);
            let mut xd = up(g, &x);
            let pd = up(g, &pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
            g.rope(&mut xd, &pd, RopeSpec { heads, head_dim, base, style, scaled: Some(scaled) }).expect("rope");
            rel_err(&format!("scaled rope {scaling:?} {style:?}"), &down(g, &xd), &want, ROPE_BOUND);
        }
    }
}

/// Bias rows and the attention temperature: one add / one multiply per value, exact.
#[test]
fn cuda_bias_and_temperature_match_cpu_exactly() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_bias_and_temperature_match_cpu_exactly");
    let (rows, width) = (5, 384);
    let x = randn(&mut rng, rows * width, 2.0);
    let b = randn(&mut rng, width, 0.5);
    let mut want = x.clone();
    ops::add_rows_inplace(&mut want, &b);
    let mut xd = up(g, &x);
    g.add_rows(&mut xd.slice_mut(..), &up(g, &b)).expect("add_rows");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&down(g, &xd)), bits(&want), "add_rows");
    let t = AttnTemperature { scale: 0.1, floor: 16 };
    let pos = [0usize, 15, 16, 100, 70_000];
    let mut want = x[..pos.len() * width].to_vec();
    for (row, &p) in want.chunks_exact_mut(width).zip(&pos) {
        ops::scale_inplace(row, t.at(p));
    }
    let mut xd = up(g, &x[..pos.len() * width]);
    let pd = up(g, &pos.iter().map(|&p| p as i32).collect::<Vec<_>>());
    g.attn_temperature(&mut xd, &pd, t).expect("attn_temperature");
    assert_eq!(bits(&down(g, &xd)), bits(&want), "attn_temperature");
}

#[test]
fn cuda_gated_activations_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gated_activations_match_cpu");
    for n in [1000, 4096, 8195] {
        let (a, u) = (randn(&mut rng, n, 12.0), randn(&mut rng, n, 2.0));
        let mut want = a.clone();
        ops::silu_mul(&mut want, &u);
        let mut ad = up(g, &a);
        g.silu_mul(&mut ad, &up(g, &u)).expect("silu_mul");
        rel_err(&format!("silu_mul n={n}"), &down(g, &ad), &want, SILU_BOUND);

        let mut want = a.clone();
        ops::gelu_mul(&mut want, &u);
        let mut ad = up(g, &a);
        g.gelu_mul(&mut ad, &up(g, &u)).expect("gelu_mul");
        rel_err(&format!("gelu_mul n={n}"), &down(g, &ad), &want, GELU_BOUND);

        // SwiGLU-OAI on gates and ups past its ±7 limits (a and u span ±12 and ±2; u
        // scaled up to reach the clamp too); libm's exp on both sides.
        let u7: Vec<f32> = u.iter().map(|v| v * 5.0).collect();
        let mut want = a.clone();
        ops::swiglu_oai(&mut want, &u7);
        let mut ad = up(g, &a);
        g.swiglu_oai(&mut ad, &up(g, &u7)).expect("swiglu_oai");
        rel_err(&format!("swiglu_oai n={n}"), &down(g, &ad), &want, SILU_BOUND);

        let mut want = a.clone();
        ops::add_inplace(&mut want, &u);
        let mut ad = up(g, &a);
        g.add(&mut ad, &up(g, &u)).expect("add");
        rel_err(&format!("add n={n}"), &down(g, &ad), &want, 0.0);
    }
}

#[test]
fn cuda_argmax_takes_first_maximum() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_argmax_takes_first_maximum");
    for (rows, n) in [(1, 32_000), (4, 151_936), (3, 7)] {
        let mut x = randn(&mut rng, rows * n, 10.0);
        for r in 0..rows {
            // A tie for the maximum: the earlier index must win.
            let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
            x[r * n + i] = 50.0;
            x[r * n + j] = 50.0;
        }
        let want: Vec<i32> = x
            .chunks_exact(n)
            .map(|row| {
                let mut best = 0;
                for (i, v) in row.iter().enumerate() {
                    if *v > row[best] {
                        best = i;
                    }
                }
                best as i32
            })
            .collect();
        let mut out = up(g, &vec![-1i32; rows]);
        g.argmax(&up(g, &x), n, &mut out).expect("argmax");
        assert_eq!(down(g, &out), want, "argmax rows={rows} n={n}");
        println!("argmax rows={rows} n={n}: exact");
    }
}

/// The fused norm- and gate-quantize kernels leave exactly the quantized activations
/// the unfused op followed by `quantize` leaves, in every activation format.
#[test]
fn cuda_fused_quantize_equals_unfused() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_fused_quantize_equals_unfused");
    let same = |a: &super::DeviceAct, b: &super::DeviceAct| {
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        if !a.format.is_float() {
            assert_eq!(down(g, &a.qs), down(g, &b.qs), "{:?} values", a.format);
        }
        assert_eq!(bits(down(g, &a.d)), bits(down(g, &b.d)), "{:?} scales", a.format);
        match a.format {
            super::ActFormat::Q8K => assert_eq!(down(g, &a.bsums), down(g, &b.bsums), "Q8_K sums"),
            super::ActFormat::Q8_1 => assert_eq!(bits(down(g, &a.s)), bits(down(g, &b.s)), "Q8_1 sums"),
            super::ActFormat::Q8_0 | super::ActFormat::F32 | super::ActFormat::Bf16 => {}
        }
    };
    use super::ActFormat::{Bf16, F32, Q8_0, Q8_1, Q8K};
    // The float formats (F16 / BF16 weights) run the unfused ops themselves: the same
    // values by construction, checked all the same.
    for format in [Q8_0, Q8_1, Q8K, F32, Bf16] {
        // Widths up to ~6,000 are staged in shared memory, 8192 is read from memory twice.
        for (rows, width) in [(1, 2048), (5, 4096), (3, 1536), (2, 8192)] {
            let x = up(g, &randn(&mut rng, rows * width, 3.0));
            let w = up(g, &randn(&mut rng, width, 1.0));
            let alloc = || super::DeviceAct::alloc(g, format, rows, width).expect("alloc");
            let (mut fused, mut plain) = (alloc(), alloc());
            g.norm_quantize(&x, &w, 1e-6, &mut fused).expect("norm_quantize");
            let mut h = nans(g, rows * width);
            g.rms_norm(&x, &w, &mut h, 1e-6).expect("rms_norm");
            g.quantize(&h, &mut plain).expect("quantize");
            same(&fused, &plain);
            // x += y fused in front: the same activations, and x left as add_inplace leaves it.
            let y = up(g, &randn(&mut rng, rows * width, 1.0));
            let (mut x1, mut x2) = (up(g, &down(g, &x)), up(g, &down(g, &x)));
            let (mut fused, mut plain) = (alloc(), alloc());
            g.add_norm_quantize(&mut x1, &y, &w, 1e-6, &mut fused).expect("add_norm_quantize");
            g.add(&mut x2, &y).expect("add");
            g.norm_quantize(&x2, &w, 1e-6, &mut plain).expect("norm_quantize");
            same(&fused, &plain);
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(down(g, &x1)), bits(down(g, &x2)), "add_norm_quantize: x");
            use crate::backend::Gate;
            for gate in [Gate::Silu, Gate::Gelu, Gate::SwigluOai] {
                let u = up(g, &randn(&mut rng, rows * width, 1.0));
                let (mut fused, mut plain) = (alloc(), alloc());
                g.gate_quantize(&x, &u, gate, &mut fused).expect("gate_quantize");
                let mut gx = up(g, &down(g, &x));
                match gate {
                    Gate::Silu => g.silu_mul(&mut gx, &u).expect("silu_mul"),
                    Gate::Gelu => g.gelu_mul(&mut gx, &u).expect("gelu_mul"),
                    Gate::SwigluOai => g.swiglu_oai(&mut gx, &u).expect("swiglu_oai"),
                }
                g.quantize(&gx, &mut plain).expect("quantize");
                same(&fused, &plain);
            }
        }
        println!("fused quantize {format:?}: identical to the unfused ops");
    }
}
