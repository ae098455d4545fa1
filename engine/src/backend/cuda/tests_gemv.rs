//! The two GEMV kernel forms (`gemv.rs`): at one activation row the one-row kernels give
//! exactly the several-row kernels' outputs for every format, alone and three matrices
//! per launch; and both forms' speed at one row on the matrix shapes of 1B and 8B Llama
//! models (and the several-row kernel's at 8 rows).

use candle_core::quantized::GgmlDType;

use super::tests::{TYPES, down, gpu, nans, randn, random_weights, rng, up};
use super::*;
use crate::gguf::Stored;

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A bias in the GEMV's epilogue (qwen2's Q/K/V) gives exactly the product plus the bias,
/// for one-row and several-row launches, alone and three matrices per launch.
#[test]
fn cuda_gemv_bias_epilogue_adds_exactly() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gemv_bias_epilogue_adds_exactly");
    for dtype in [Stored::Ggml(GgmlDType::Q4_0), Stored::Ggml(GgmlDType::Q4K), Stored::Ggml(GgmlDType::Q5K)] {
        let (k, m, ns) = (512, 9, [96, 32, 32]);
        let mut ws: Vec<DeviceWeights> = ns
            .iter()
            .map(|&n| {
                let b = random_weights(&mut rng, dtype, n, k);
                DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &b, k, n }).expect("upload")
            })
            .collect();
        let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
        g.quantize(&up(g, &randn(&mut rng, m * k, 2.0)), &mut act).expect("quantize");
        let run = |ws: &[DeviceWeights]| {
            let mut alone: Vec<_> = ns.iter().map(|&n| nans(g, m * n)).collect();
            for (w, y) in ws.iter().zip(alone.iter_mut()) {
                g.gemv_rows(w, &act, y, 0..1).expect("gemv");
                g.gemv_rows(w, &act, y, 1..m).expect("gemv");
            }
            let mut many: Vec<_> = ns.iter().map(|&n| nans(g, m * n)).collect();
            let refs: Vec<&DeviceWeights> = ws.iter().collect();
            g.gemv_many(&refs, &act, &mut many, 0..1).expect("gemv_many");
            g.gemv_many(&refs, &act, &mut many, 1..m).expect("gemv_many");
            [alone, many].map(|ys| ys.iter().map(|y| down(g, y)).collect::<Vec<_>>())
        };
        let plain = run(&ws);
        let biases: Vec<Vec<f32>> = ns.iter().map(|&n| randn(&mut rng, n, 1.0)).collect();
        for (w, b) in ws.iter_mut().zip(&biases).skip(1) {
            w.bias = Some(up(g, b));
        }
        let biased = run(&ws);
        for (p, got) in plain.iter().zip(&biased) {
            for (i, (y, yb)) in p.iter().zip(got).enumerate() {
                let want: Vec<f32> = match i {
                    0 => y.clone(),
                    _ => y.chunks_exact(ns[i]).flat_map(|r| r.iter().zip(&biases[i]).map(|(a, b)| a + b)).collect(),
                };
                assert!(same(yb, &want), "{dtype:?} matrix {i}: bias epilogue differs from product + bias");
            }
        }
        println!("gemv {dtype:?}: bias epilogue = product + bias, alone and three per launch");
    }
}

#[test]
fn cuda_gemv_one_row_equals_several_row_kernel() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gemv_one_row_equals_several_row_kernel");
    for dtype in TYPES {
        let (k, m) = (2304, 11);
        let ns = [300, 64, 97];
        let bytes: Vec<Vec<u8>> = ns.iter().map(|&n| random_weights(&mut rng, dtype, n, k)).collect();
        let ws: Vec<DeviceWeights> = bytes
            .iter()
            .zip(ns)
            .map(|(b, n)| DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: b, k, n }).expect("upload"))
            .collect();
        let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
        g.quantize(&up(g, &randn(&mut rng, m * k, 2.0)), &mut act).expect("quantize");
        // One row (from row 0, 4 and 10), and launches of 8 + 1 rows, where the last row
        // takes the one-row kernel unless forced onto the other.
        for rows in [0..1, 4..5, 10..11, 0..9, 2..11] {
            let w = &ws[0];
            let mut ys = [nans(g, m * w.n), nans(g, m * w.n)];
            for (multi, y) in [true, false].into_iter().zip(ys.iter_mut()) {
                g.gemv_rows_as(multi, w, &act, y, rows.clone()).expect("gemv");
            }
            let (a, b) = (down(g, &ys[0]), down(g, &ys[1]));
            let span = rows.start * w.n..rows.end * w.n;
            assert!(same(&a[span.clone()], &b[span]), "{dtype:?} rows {rows:?}: one-row kernel differs");
            let refs: Vec<&DeviceWeights> = ws.iter().collect();
            let mut outs = Vec::new();
            for multi in [true, false] {
                let mut ys: Vec<_> = ns.iter().map(|&n| nans(g, m * n)).collect();
                g.gemv_many_as(multi, &refs, &act, &mut ys, rows.clone()).expect("gemv_many");
                outs.push(
                    ys.iter()
                        .zip(ns)
                        .map(|(y, n)| down(g, y)[rows.start * n..rows.end * n].to_vec())
                        .collect::<Vec<_>>(),
                );
            }
            assert!(
                outs[0].iter().zip(&outs[1]).all(|(a, b)| same(a, b)),
                "{dtype:?} rows {rows:?}: gemv_many differs"
            );
        }
        println!("gemv {dtype:?}: one-row kernel = several-row kernel, alone and three per launch");
    }
}

/// µs per GEMV of `w`-shaped matrices at `m` activation rows, rotating enough copies
/// that the 60 MB L2 cannot hold them.
fn time_gemv(g: &Gpu, copies: &[DeviceWeights], act: &DeviceAct, multi: bool) -> f64 {
    let mut y = nans(g, act.rows * copies[0].n);
    for w in copies {
        g.gemv_rows_as(multi, w, act, &mut y, 0..act.rows).expect("warm-up");
    }
    let ev = || g.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
    let (start, end) = (ev(), ev());
    let reps = 10;
    start.record(&g.stream).expect("record");
    for _ in 0..reps {
        for w in copies {
            g.gemv_rows_as(multi, w, act, &mut y, 0..act.rows).expect("gemv");
        }
    }
    end.record(&g.stream).expect("record");
    g.synchronize().expect("sync");
    start.elapsed_ms(&end).expect("elapsed") as f64 * 1e3 / (reps * copies.len()) as f64
}

/// Decode GEMV speed, at one row on both kernels (informational; asserts only that it ran):
/// GB/s of repacked weight bytes read once per launch.
#[test]
fn cuda_gemv_bandwidth() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gemv_bandwidth");
    let llama = [
        (6144, 4096),
        (4096, 4096),
        (14336, 4096),
        (4096, 14336),
        (3072, 2048),
        (2048, 2048),
        (8192, 2048),
        (2048, 8192),
    ];
    let mut cases: Vec<(Stored, usize, usize, usize)> = Vec::new();
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q4K] {
        cases.extend(llama.iter().map(|&(n, k)| (Stored::Ggml(dtype), n, k, 1)));
    }
    // Every other format at one FFN shape (the later ones untuned: their first numbers).
    let others = TYPES.into_iter().filter(|t| ![GgmlDType::Q4_0, GgmlDType::Q4K].map(Stored::Ggml).contains(t));
    cases.extend(others.map(|t| (t, 14336, 4096, 1)));
    cases.extend([
        (Stored::Ggml(GgmlDType::Q6K), 4096, 14336, 1),
        (Stored::Ggml(GgmlDType::Q4_0), 14336, 4096, 8),
        (Stored::Ggml(GgmlDType::Q4K), 14336, 4096, 8),
    ]);
    for (dtype, n, k, m) in cases {
        let bytes = random_weights(&mut rng, dtype, n, k);
        let one = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
        let count = (240e6 / one.device_bytes() as f64).ceil() as usize;
        let mut copies = vec![one];
        while copies.len() < count {
            copies
                .push(DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload"));
        }
        let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
        g.quantize(&up(g, &randn(&mut rng, m * k, 1.0)), &mut act).expect("quantize");
        let mb = copies[0].device_bytes() as f64 / 1e6;
        let multi = time_gemv(g, &copies, &act, true);
        if m == 1 {
            let one = time_gemv(g, &copies, &act, false);
            println!(
                "bandwidth {dtype:?} {n}x{k} m=1 ({mb:.1} MB): one-row kernel {one:.1} us {:.0} GB/s, several-row kernel {multi:.1} us {:.0} GB/s",
                mb * 1e3 / one,
                mb * 1e3 / multi
            );
            assert!(one > 0.0);
        } else {
            println!("bandwidth {dtype:?} {n}x{k} m={m} ({mb:.1} MB): {multi:.1} us {:.0} GB/s", mb * 1e3 / multi);
        }
        assert!(multi > 0.0);
    }
}
