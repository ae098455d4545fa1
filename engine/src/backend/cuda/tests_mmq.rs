//! The prefill matmuls — the tensor-core MMQ kernel (`mmq.rs`) and cuBLAS on widened
//! values (`gemm.rs`) — against the CPU engine's matmul, every weight format, on shapes
//! that leave partial tiles in both directions, and on a run of rows that starts inside
//! the activations; and their speed on an 8B-sized matrix. Also the GEMV of several
//! matrices in one launch against one GEMV each.

use candle_core::quantized::GgmlDType;

use super::gemm::Prefill;
use super::tests::{GEMV_BOUND, TYPES, cpu_matmul, down, gpu, nans, randn, random_weights, rel_err, rng, up};
use super::*;
use crate::gguf::Stored;

#[test]
fn cuda_mmq_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_mmq_matches_cpu");
    // The other formats have no MMQ kernel: their long chunks take the GEMV.
    for dtype in TYPES.into_iter().filter(|&t| super::mmq::has_mmq_kernel(t)) {
        for (n, k, m, from) in [(300, 4096, 77, 0), (1000, 2304, 64, 0), (256, 1536, 130, 9), (64, 512, 32, 1)] {
            let bytes = random_weights(&mut rng, dtype, n, k);
            let x = randn(&mut rng, m * k, 2.0);
            let want = cpu_matmul(dtype, &bytes, &x, m, k, n);
            let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
            let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
            g.quantize(&up(g, &x), &mut act).expect("quantize");
            let mut y = nans(g, m * n);
            if from > 0 {
                g.gemv_rows(&w, &act, &mut y, 0..from).expect("gemv");
            }
            g.mmq_rows(&w, &act, &mut y, from..m).expect("mmq");
            let what = format!("mmq {dtype:?} n={n} k={k} rows {from}..{m}");
            rel_err(&what, &down(g, &y), &want, GEMV_BOUND);
        }
    }
}

/// cuBLAS against the CPU's int8 dots: f16 values are rounded once each (weights and
/// activations), about 2^-11 relative per product, which averages down over k terms; in
/// f32, Q4_1's `d * q + m` per value cancels differently from the CPU's `d * Σ q x + m * Σ x`.
const CUBLAS_BOUND: f64 = 2e-3;

#[test]
fn cuda_cublas_prefill_matches_cpu() {
    let Some(g) = gpu() else { return };
    if !g.has_gemm() {
        println!("skipped: cuBLAS not loaded");
        return;
    }
    let mut rng = rng("cuda_cublas_prefill_matches_cpu");
    for dtype in TYPES {
        for (n, k, m, from) in [(300, 4096, 77, 0), (256, 1536, 130, 9)] {
            let bytes = random_weights(&mut rng, dtype, n, k);
            let x = randn(&mut rng, m * k, 2.0);
            let want = cpu_matmul(dtype, &bytes, &x, m, k, n);
            let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
            let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
            g.quantize(&up(g, &x), &mut act).expect("quantize");
            for prefill in [Prefill::F16, Prefill::F32] {
                let mut y = nans(g, m * n);
                if from > 0 {
                    g.gemv_rows(&w, &act, &mut y, 0..from).expect("gemv");
                }
                let ww = g.dequant_wide(&w, prefill).expect("weights");
                let xw = g.dequant_act_wide(&act, prefill).expect("activations");
                g.gemm_rows(&ww, (n, k), &xw, from..m, &mut y).expect("gemm");
                let what = format!("cuBLAS {prefill:?} {dtype:?} n={n} k={k} rows {from}..{m}");
                rel_err(&what, &down(g, &y), &want, CUBLAS_BOUND);
            }
        }
    }
}

/// Prefill matmul speed on an 8B FFN matrix at 512 tokens: prints TFLOP/s
/// (informational; asserts only that it ran).
#[test]
fn cuda_mmq_throughput() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_mmq_throughput");
    let (n, k, m) = (14336, 4096, 512);
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K].map(Stored::Ggml) {
        let bytes = random_weights(&mut rng, dtype, n, k);
        let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
        let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
        g.quantize(&up(g, &randn(&mut rng, m * k, 1.0)), &mut act).expect("quantize");
        let mut y = nans(g, m * n);
        g.mmq_rows(&w, &act, &mut y, 0..m).expect("warm-up");
        let ev = |_: ()| g.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
        let (start, end) = (ev(()), ev(()));
        let reps = 10;
        start.record(&g.stream).expect("record");
        for _ in 0..reps {
            g.mmq_rows(&w, &act, &mut y, 0..m).expect("mmq");
        }
        end.record(&g.stream).expect("record");
        g.synchronize().expect("sync");
        let ms = start.elapsed_ms(&end).expect("elapsed") as f64 / reps as f64;
        let tflops = 2.0 * (n * k * m) as f64 / (ms * 1e-3) / 1e12;
        println!("mmq {dtype:?} {n}x{k} m={m}: {:.0} us, {tflops:.0} TFLOP/s", ms * 1e3);
        assert!(tflops > 0.0);
        if g.has_gemm() {
            // f16 cuBLAS, the weights widened on every call as the forward does.
            let xw = g.dequant_act_wide(&act, Prefill::F16).expect("activations");
            let ww = g.dequant_wide(&w, Prefill::F16).expect("weights");
            g.gemm_rows(&ww, (n, k), &xw, 0..m, &mut y).expect("warm-up");
            start.record(&g.stream).expect("record");
            for _ in 0..reps {
                let ww = g.dequant_wide(&w, Prefill::F16).expect("weights");
                g.gemm_rows(&ww, (n, k), &xw, 0..m, &mut y).expect("gemm");
            }
            end.record(&g.stream).expect("record");
            g.synchronize().expect("sync");
            let ms = start.elapsed_ms(&end).expect("elapsed") as f64 / reps as f64;
            let tflops = 2.0 * (n * k * m) as f64 / (ms * 1e-3) / 1e12;
            println!(
                "cuBLAS f16 {dtype:?} {n}x{k} m={m} (with dequantization): {:.0} us, {tflops:.0} TFLOP/s",
                ms * 1e3
            );
        }
    }
}

/// Two or three matrices in one GEMV launch give exactly the GEMV's result for each.
#[test]
fn cuda_gemv_many_equals_gemv() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gemv_many_equals_gemv");
    for dtype in TYPES {
        let (k, m) = (1536, 11);
        let ns = [768, 256, 300];
        let bytes: Vec<Vec<u8>> = ns.iter().map(|&n| random_weights(&mut rng, dtype, n, k)).collect();
        let ws: Vec<DeviceWeights> = bytes
            .iter()
            .zip(ns)
            .map(|(b, n)| DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: b, k, n }).expect("upload"))
            .collect();
        let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
        g.quantize(&up(g, &randn(&mut rng, m * k, 2.0)), &mut act).expect("quantize");
        for count in [2, 3] {
            let refs: Vec<&DeviceWeights> = ws.iter().take(count).collect();
            let mut ys: Vec<_> = ns.iter().take(count).map(|&n| nans(g, m * n)).collect();
            g.gemv_many(&refs, &act, &mut ys, 0..m).expect("gemv_many");
            for (w, y) in refs.iter().zip(&ys) {
                let mut alone = nans(g, m * w.n);
                g.gemv(w, &act, &mut alone).expect("gemv");
                let (a, b) = (down(g, y), down(g, &alone));
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{dtype:?}: {count} together differ"
                );
            }
        }
        println!("gemv_many {dtype:?}: equal to one GEMV per matrix");
    }
}
