//! The matmuls' batch invariance: rows together equal rows alone, and matrices run
//! together (`forward_each`) equal each run alone.

use super::act::QK;
use super::*;

/// `n` rows of `k / QK` blocks of `per` bytes each, with small valid f16 scales.
fn blocks(k: usize, n: usize, per: usize, seed: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..n * k / QK * per).map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8).collect();
    for blk in b.chunks_exact_mut(per) {
        for h in 0..if per == 20 { 2 } else { 1 } {
            let v = half::f16::from_f32(0.01 + blk[2 * h] as f32 / 4096.0);
            blk[2 * h..2 * h + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// `m` rows of `k` activations.
fn rows(m: usize, k: usize, seed: usize) -> Vec<f32> {
    (0..m * k).map(|i| (((i * 37 + i / k * 11 + seed) % 251) as f32 - 125.0) / 29.0).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// A matmul of many rows equals each row alone (the one-row decode kernels), bit for
/// bit: column chunks with an odd last width, row blocks with a ragged last group,
/// tiles and grouped kernels alike.
#[test]
fn rows_together_equal_rows_alone() {
    let (k, n) = (8 * QK, 37);
    for (dtype, per) in [(GgmlDType::Q4_1, 20), (GgmlDType::Q5_0, 22), (GgmlDType::Q8_0, 34)] {
        let w = QuantMatMul::from_bytes("w", Stored::Ggml(dtype), &blocks(k, n, per, per), k, n).unwrap();
        for m in [4, 7, 53, 106] {
            let x = rows(m, k, 0);
            let got = w.forward(&x, m);
            for r in 0..m {
                let want = w.forward(&x[r * k..(r + 1) * k], 1);
                assert!(same_bits(&want, &got[r * n..(r + 1) * n]), "{dtype:?} m={m} row {r}");
            }
        }
    }
}

/// Matrices of different shapes and formats, each on rows of its own (two sharing one
/// slice, one with no rows), in one `forward_each`: every output equals its matrix's
/// `forward` alone.
#[test]
fn matrices_on_rows_of_their_own_equal_each_alone() {
    let k = 4 * QK;
    let q8 = |n: usize, seed: usize| {
        QuantMatMul::from_bytes("w", Stored::Ggml(GgmlDType::Q8_0), &blocks(k, n, 34, seed), k, n).unwrap()
    };
    let q41 = QuantMatMul::from_bytes("w", Stored::Ggml(GgmlDType::Q4_1), &blocks(k, 21, 20, 5), k, 21).unwrap();
    let (a, b, c) = (q8(40, 1), q8(16, 2), q8(5, 3));
    let (x1, x2, x3) = (rows(9, k, 1), rows(1, k, 2), rows(6, k, 3));
    let jobs = [
        Job { w: &a, x: Src::Rows(&x1), m: 9 },
        Job { w: &b, x: Src::Rows(&x1), m: 9 },
        Job { w: &q41, x: Src::Rows(&x1), m: 9 },
        Job { w: &c, x: Src::Rows(&x2), m: 1 },
        Job { w: &a, x: Src::Rows(&[]), m: 0 },
        Job { w: &b, x: Src::Rows(&x3), m: 6 },
    ];
    let mut outs: Vec<Vec<f32>> = jobs.iter().map(|j| vec![f32::NAN; j.m * j.w.n]).collect();
    QuantMatMul::forward_each(&jobs, &mut outs.iter_mut().map(Vec::as_mut_slice).collect::<Vec<_>>());
    for (i, (j, got)) in jobs.iter().zip(&outs).enumerate() {
        assert!(same_bits(&j.w.forward(&j.x.gather(k), j.m), got), "job {i}");
    }
}

/// Rows picked from a shared batch (`Src::Picked`: repeated, out of order, none), the
/// batch quantized once for every job whose format allows it, and Q4_K's grouped rows
/// (which are quantized by their place in the job's rows) gathered and quantized as a
/// slice: every output equals its matrix's `forward` of the gathered rows alone.
#[test]
fn rows_picked_from_a_batch_equal_the_gathered_rows_alone() {
    let k = 2 * act::QK_K;
    let q8 = QuantMatMul::from_bytes("w", Stored::Ggml(GgmlDType::Q8_0), &blocks(k, 24, 34, 1), k, 24).unwrap();
    let q41 = QuantMatMul::from_bytes("w", Stored::Ggml(GgmlDType::Q4_1), &blocks(k, 17, 20, 2), k, 17).unwrap();
    // 19 rows of two 144-byte super-blocks, each starting with a small f16 d.
    let mut b = blocks(k, 19, 18, 3);
    for blk in b.chunks_exact_mut(144) {
        // dmin, like d, a small valid f16.
        let dmin = half::f16::from_f32(0.003 + blk[3] as f32 / 8192.0);
        blk[2..4].copy_from_slice(&dmin.to_le_bytes());
    }
    let q4k = QuantMatMul::from_bytes("w", Stored::Ggml(GgmlDType::Q4K), &b, k, 19).unwrap();
    let x = rows(10, k, 4);
    let own = rows(3, k, 5);
    let (some, run, one): (&[usize], &[usize], &[usize]) = (&[3, 0, 7, 7, 9], &[1, 2, 3, 4, 5, 6], &[8]);
    let picked = |rows| Src::Picked { x: &x, rows };
    let jobs = [
        Job { w: &q8, x: picked(some), m: 5 },
        Job { w: &q41, x: picked(some), m: 5 },
        Job { w: &q4k, x: picked(run), m: 6 },
        Job { w: &q4k, x: picked(one), m: 1 },
        Job { w: &q8, x: Src::Rows(&own), m: 3 },
        Job { w: &q8, x: picked(&[]), m: 0 },
        Job { w: &q41, x: picked(run), m: 6 },
    ];
    let mut outs: Vec<Vec<f32>> = jobs.iter().map(|j| vec![f32::NAN; j.m * j.w.n]).collect();
    QuantMatMul::forward_each(&jobs, &mut outs.iter_mut().map(Vec::as_mut_slice).collect::<Vec<_>>());
    for (i, (j, got)) in jobs.iter().zip(&outs).enumerate() {
        let want = j.w.forward(&j.x.gather(k), j.m);
        assert!(got.iter().all(|v| v.is_finite()), "job {i}");
        assert!(same_bits(&want, got), "job {i}");
    }
}
