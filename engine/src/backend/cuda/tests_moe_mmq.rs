//! The grouped MMQ (`mmq_id.rs`): the mixture of experts' prefill path against the CPU's
//! experts (`kernels::moe`) on the byte-built files of its tests (qwen3moe's Q8_0 and
//! Q4_0 experts, gpt-oss's MXFP4 ones with biases), rows routed unevenly; each row alone
//! equal, bit for bit, to the row in company; and the grouped kernel on larger stacks of
//! every format it takes against the CPU's matmul and, bit for bit, the dense MMQ of each
//! expert's matrix alone.

use super::mmq::has_mmq_kernel;
use super::mmq_id::{TILE_ROWS, has_mmq_id_kernel};
use super::moe::{DeviceExperts, ExpertMatmul};
use super::tests::{GEMV_BOUND, TYPES, cpu_matmul, down, gpu, nans, randn, random_weights, rel_err, rng, up};
use super::tests_moe::MOE_BOUND;
use super::*;
use crate::config::{MoeConfig, MoeKind};
use crate::gguf::Gguf;
use crate::kernels::moe::Experts;
use crate::kernels::moe::tests::{E, H, W, file, file_q4_0};

/// `rows` rows of `H` values none of which routes to expert 0, so one expert gets no
/// rows and, at 300 rows (600 pairs among three experts), another more than two tiles.
fn uneven_rows(cpu: &Experts, rows: usize, seed: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * H);
    let mut i = seed;
    while x.len() < rows * H {
        let noise = |v: usize| ((v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 1000;
        let row: Vec<f32> = (0..H).map(|j| noise(i * H + j) as f32 / 250.0 - 2.0).collect();
        i += 1;
        if cpu.route(&row).iter().all(|&(e, _)| e != 0) {
            x.extend(row);
        }
        assert!(i < seed + 100 * rows + 1000, "too few rows avoid expert 0");
    }
    x
}

/// Rows each expert gets from the rows `x`.
fn per_expert(cpu: &Experts, x: &[f32]) -> [usize; E] {
    let mut n = [0; E];
    for row in x.chunks_exact(H) {
        cpu.route(row).iter().for_each(|&(e, _)| n[e] += 1);
    }
    n
}

#[test]
fn cuda_moe_mmq_matches_cpu_and_rows_alone() {
    let Some(g) = gpu() else { return };
    if !g.has_mmq() {
        println!("skipped: no int8 mma.sync (sm_80 or later)");
        return;
    }
    let files: [(&str, MoeKind, Gguf); 3] = [
        ("qwen3moe q8_0", MoeKind::Qwen3, file(MoeKind::Qwen3)),
        ("qwen3moe q4_0", MoeKind::Qwen3, file_q4_0()),
        ("gpt-oss mxfp4", MoeKind::GptOss, file(MoeKind::GptOss)),
    ];
    for (what, kind, file) in &files {
        let m = MoeConfig { experts: E, used: 2, width: W, kind: *kind, shared: None };
        let cpu = Experts::load(file, 0, H, m).expect("CPU experts");
        let dev = DeviceExperts::load(g, file, 0, H, m).expect("device experts");
        for rows in [1, 9, 64, 300] {
            let x = uneven_rows(&cpu, rows, 3 * rows);
            let counts = per_expert(&cpu, &x);
            assert_eq!(counts[0], 0, "{what}: expert 0 must get no rows");
            if rows == 300 {
                assert!(counts.iter().any(|&c| c > 2 * TILE_ROWS), "{what}: {counts:?}");
            }
            let want = cpu.forward(&x).expect("CPU forward");
            let got = down(g, &g.moe(&up(g, &x), &dev, ExpertMatmul::Mmq).expect("moe"));
            rel_err(&format!("moe mmq {what} rows={rows} per expert {counts:?}"), &got, &want, MOE_BOUND);
            if rows == 1 {
                continue;
            }
            for (r, row) in x.chunks_exact(H).enumerate() {
                let alone = down(g, &g.moe(&up(g, row), &dev, ExpertMatmul::Mmq).expect("moe"));
                let company = &got[r * H..(r + 1) * H];
                let same = alone.iter().zip(company).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{what}: row {r} of {rows} differs from the row alone");
            }
        }
    }
}

/// One expert's share of a stack: its rows of the stacked matrix's bytes.
fn expert_bytes(stack: &[u8], experts: usize, e: usize) -> &[u8] {
    let per = stack.len() / experts;
    &stack[e * per..(e + 1) * per]
}

#[test]
fn cuda_mmq_id_matches_cpu_and_dense_mmq() {
    let Some(g) = gpu() else { return };
    if !g.has_mmq() {
        println!("skipped: no int8 mma.sync (sm_80 or later)");
        return;
    }
    let mut rng = rng("cuda_mmq_id_matches_cpu_and_dense_mmq");
    // Rows per expert, sorted by expert: none, partial tiles, several tiles and one row.
    let counts = [150, 0, 37, 64, 1, 48];
    let experts = counts.len();
    let m: usize = counts.iter().sum();
    let ids: Vec<i32> = counts.iter().enumerate().flat_map(|(e, &c)| std::iter::repeat_n(e as i32, c)).collect();
    let tiles = g.moe_tiles(&up(g, &ids), m, experts).expect("tiles");
    for dtype in TYPES.into_iter().filter(|&t| has_mmq_id_kernel(t)) {
        // n: a partial tile of weight rows.
        for (n, k) in [(200, 512), (96, 1024)] {
            let stack = random_weights(&mut rng, dtype, experts * n, k);
            let x = randn(&mut rng, m * k, 2.0);
            let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &stack, k, n: experts * n })
                .expect("upload");
            let mut act = DeviceAct::alloc(g, ActFormat::for_weights(dtype).expect("fmt"), m, k).expect("alloc");
            g.quantize(&up(g, &x), &mut act).expect("quantize");
            let mut y = nans(g, m * n);
            g.mmq_id(&w, n, &act, &tiles, &mut y).expect("mmq_id");
            let y = down(g, &y);
            let mut first = 0;
            for (e, &c) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                let bytes = expert_bytes(&stack, experts, e);
                let (rows, ys) = (first..first + c, &y[first * n..(first + c) * n]);
                let want = cpu_matmul(dtype, bytes, &x[first * k..(first + c) * k], c, k, n);
                rel_err(&format!("mmq_id {dtype:?} n={n} k={k} expert {e} ({c} rows)"), ys, &want, GEMV_BOUND);
                if has_mmq_kernel(dtype) {
                    let we = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes, k, n }).expect("upload");
                    let mut dense = nans(g, m * n);
                    g.mmq_rows(&we, &act, &mut dense, rows).expect("mmq");
                    let dense = down(g, &dense);
                    let same =
                        ys.iter().zip(&dense[first * n..(first + c) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "mmq_id {dtype:?} n={n} k={k} expert {e}: differs from the dense MMQ");
                }
                first += c;
            }
        }
    }
}

#[test]
fn cuda_moe_tiles_cut_each_experts_rows() {
    let Some(g) = gpu() else { return };
    // 300 pairs in routing order (not sorted), among 5 of 7 experts.
    let experts = 7;
    let ids: Vec<i32> = (0..300).map(|p| [3, 0, 3, 6, 3, 2, 0, 3, 5, 3][p % 10]).collect();
    let tiles = down(g, &g.moe_tiles(&up(g, &ids), ids.len(), experts).expect("tiles"));
    let mut want: Vec<i32> = Vec::new();
    let mut first = 0;
    for e in 0..experts as i32 {
        let rows = ids.iter().filter(|&&i| i == e).count() as i32;
        for at in (0..rows).step_by(TILE_ROWS) {
            want.extend([e, first + at, (rows - at).min(TILE_ROWS as i32)]);
        }
        first += rows;
    }
    want.resize(tiles.len(), 0);
    assert_eq!(tiles, want);
}
