//! The matmuls' batch invariance: rows together equal rows alone, and matrices run
//! together (`forward_each`) equal each run alone.

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
        Job { w: &a, x: &x1, m: 9 },
        Job { w: &b, x: &x1, m: 9 },
        Job { w: &q41, x: &x1, m: 9 },
        Job { w: &c, x: &x2, m: 1 },
        Job { w: &a, x: &[], m: 0 },
        Job { w: &b, x: &x3, m: 6 },
    ];
    let mut outs: Vec<Vec<f32>> = jobs.iter().map(|j| vec![f32::NAN; j.m * j.w.n]).collect();
    QuantMatMul::forward_each(&jobs, &mut outs.iter_mut().map(Vec::as_mut_slice).collect::<Vec<_>>());
    for (i, (j, got)) in jobs.iter().zip(&outs).enumerate() {
        assert!(same_bits(&j.w.forward(j.x, j.m), got), "job {i}");
    }
}
