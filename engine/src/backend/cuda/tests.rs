//! Op-level harness: the same random inputs through the CPU op and the CUDA op, device
//! outputs NaN-filled before each run, ‖gpu − cpu‖ / ‖cpu‖ reported and bounded per op.
//! Without a driver or a device every test prints "skipped: <reason>" and returns;
//! `cuda_kernels_compile` needs only NVRTC (and fails without it when
//! `CORRAL_REQUIRE_NVRTC=1`). Row ops are in `tests_ops.rs`.

use std::sync::OnceLock;

use candle_core::quantized::GgmlDType;
use cudarc::driver::CudaSlice;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::gguf::Stored;
use crate::kernels::quant::act::{ActQ8, Q8KSign, quantize_q8_0, quantize_q8_1, quantize_q8_k};
use crate::kernels::quant::{QuantMatMul, dequantize_row, round_bf16};

/// The shared device for every test, or why there is none (printed as "skipped").
pub(super) fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    let g = GPU.get_or_init(|| {
        if let Err(e) = Presence::probe().decide(false) {
            return Err(e.to_string());
        }
        match Gpu::open(0) {
            Ok(g) => Ok(g),
            Err(crate::Error::CudaUnavailable(e)) => Err(e.to_string()),
            // A present driver and device that fail to start is a real failure.
            Err(e) => panic!("CUDA device present but unusable: {e}"),
        }
    });
    match g {
        Ok(g) => Some(g),
        Err(reason) => {
            println!("skipped: {reason}");
            None
        }
    }
}

/// A fresh seed per run, printed so a failure can be replayed with CORRAL_TEST_SEED.
pub(super) fn rng(test: &str) -> StdRng {
    let seed = std::env::var("CORRAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

pub(super) fn randn(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

pub(super) fn up<T: cudarc::driver::DeviceRepr>(g: &Gpu, v: &[T]) -> CudaSlice<T> {
    g.stream.clone_htod(v).expect("upload")
}

pub(super) fn nans(g: &Gpu, n: usize) -> CudaSlice<f32> {
    up(g, &vec![f32::NAN; n])
}

pub(super) fn down<T: cudarc::driver::DeviceRepr + Default + Clone>(g: &Gpu, s: &CudaSlice<T>) -> Vec<T> {
    g.stream.clone_dtoh(s).expect("download")
}

/// ‖a − b‖ / ‖b‖ in f64, after checking every GPU value is finite.
pub(super) fn rel_err(op: &str, gpu: &[f32], cpu: &[f32], bound: f64) -> f64 {
    assert_eq!(gpu.len(), cpu.len(), "{op}: lengths");
    let bad = gpu.iter().filter(|v| !v.is_finite()).count();
    assert_eq!(bad, 0, "{op}: {bad} non-finite GPU outputs (unwritten or NaN)");
    let num: f64 = gpu.iter().zip(cpu).map(|(a, b)| ((*a - *b) as f64).powi(2)).sum();
    let den: f64 = cpu.iter().map(|b| (*b as f64).powi(2)).sum();
    let e = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
    println!("{op}: rel err {e:.3e} (bound {bound:.0e})");
    assert!(e <= bound, "{op}: rel err {e:.3e} > {bound:.0e}");
    e
}

/// Random GGUF bytes for an `[n, k]` matrix with finite, realistic scales.
pub(super) fn random_weights(rng: &mut StdRng, dtype: Stored, n: usize, k: usize) -> Vec<u8> {
    use GgmlDType::*;
    let per = ops::ActFormat::for_weights(dtype).map_or(32, |f| f.block().max(32));
    let mut out = Vec::new();
    let h = |rng: &mut StdRng, lo: f32, hi: f32| f16::from_f32(rng.random_range(lo..hi)).to_le_bytes();
    let bytes = |rng: &mut StdRng, out: &mut Vec<u8>, count: usize| out.extend((0..count).map(|_| rng.random::<u8>()));
    for _ in 0..n * k / per {
        match dtype {
            Stored::Ggml(Q4_0) => {
                out.extend(h(rng, 0.001, 0.02));
                bytes(rng, &mut out, 16);
            }
            Stored::Ggml(Q4_1) => {
                out.extend(h(rng, 0.001, 0.02));
                out.extend(h(rng, -0.1, 0.1));
                bytes(rng, &mut out, 16);
            }
            Stored::Ggml(Q5_0) => {
                out.extend(h(rng, 0.001, 0.02));
                bytes(rng, &mut out, 20);
            }
            Stored::Ggml(Q5_1) => {
                out.extend(h(rng, 0.001, 0.02));
                out.extend(h(rng, -0.1, 0.1));
                bytes(rng, &mut out, 20);
            }
            Stored::Ggml(Q8_0) => {
                out.extend(h(rng, 0.0001, 0.002));
                out.extend((0..32).map(|_| rng.random_range(-127i8..=127) as u8));
            }
            Stored::Iq4Nl => {
                out.extend(h(rng, 0.0001, 0.002));
                bytes(rng, &mut out, 16);
            }
            Stored::Ggml(Q4K) => {
                out.extend(h(rng, 0.0001, 0.002));
                out.extend(h(rng, 0.0001, 0.002));
                bytes(rng, &mut out, 140);
            }
            Stored::Ggml(Q5K) => {
                out.extend(h(rng, 0.0001, 0.002));
                out.extend(h(rng, 0.0001, 0.002));
                bytes(rng, &mut out, 172);
            }
            Stored::Ggml(Q3K) => {
                bytes(rng, &mut out, 108);
                out.extend(h(rng, 0.0001, 0.002));
            }
            Stored::Ggml(Q2K) => {
                bytes(rng, &mut out, 80);
                out.extend(h(rng, 0.0001, 0.002));
                out.extend(h(rng, 0.0001, 0.002));
            }
            Stored::Iq4Xs => {
                out.extend(h(rng, 0.0001, 0.002));
                bytes(rng, &mut out, 134);
            }
            Stored::Mxfp4 => {
                // E8M0 exponents 118..=122: half-scales 2^-10..2^-6 on values up to 12;
                // now and then 1 (a subnormal scale), which the CPU reads exactly too.
                out.push(if rng.random_range(0..64) == 0 { 1 } else { rng.random_range(118u8..=122) });
                bytes(rng, &mut out, 16);
            }
            Stored::Ggml(F16) => (0..32).for_each(|_| out.extend(h(rng, -0.1, 0.1))),
            Stored::Ggml(BF16) => (0..32)
                .for_each(|_| out.extend(((rng.random_range(-0.1f32..0.1).to_bits() >> 16) as u16).to_le_bytes())),
            Stored::Ggml(Q6K) => {
                bytes(rng, &mut out, 192);
                out.extend((0..16).map(|_| rng.random_range(-64i8..64) as u8));
                out.extend(h(rng, 0.0001, 0.002));
            }
            other => panic!("no random weights for {other:?}"),
        }
    }
    out
}

/// The CPU engine's result for `x · W^T`. Q4_0 goes through candle on the CPU, so its
/// reference is ggml's arithmetic written out: Q8_0 activations, exact block sums. F16
/// goes through candle too (`Linear`: widened to f32, an f32 matmul), called here.
pub(super) fn cpu_matmul(dtype: Stored, bytes: &[u8], x: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    if dtype == Stored::Ggml(GgmlDType::F16) {
        let cpu = candle_core::Device::Cpu;
        let q = candle_core::quantized::ggml_file::qtensor_from_ggml(GgmlDType::F16, bytes, vec![n, k], &cpu)
            .expect("qtensor");
        let mm = candle_core::quantized::QMatMul::from_qtensor(q).expect("qmatmul");
        let t = candle_core::Tensor::from_slice(x, (m, k), &cpu).expect("x");
        use candle_core::Module;
        return mm.forward(&t).expect("forward").flatten_all().expect("flat").to_vec1::<f32>().expect("y");
    }
    if dtype != Stored::Ggml(GgmlDType::Q4_0) {
        let w = QuantMatMul::from_bytes("w", dtype, bytes, k, n).expect("cpu weights");
        return w.forward(x, m);
    }
    let kb = k / 32;
    let acts: Vec<ActQ8> = quantize_q8_0(x);
    let mut y = vec![0.0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for b in 0..kb {
                let blk = &bytes[(j * kb + b) * 18..][..18];
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let a = &acts[r * kb + b];
                let mut s = 0i32;
                for i in 0..16 {
                    s += ((blk[2 + i] & 0xf) as i32 - 8) * a.qs[i] as i32;
                    s += ((blk[2 + i] >> 4) as i32 - 8) * a.qs[16 + i] as i32;
                }
                acc += (d * a.d) as f64 * s as f64;
            }
            y[r * n + j] = acc as f32;
        }
    }
    y
}

/// Every format with CUDA kernels.
pub(super) const TYPES: [Stored; 15] = super::formats::KERNEL_TYPES;

/// Bound for every quantized GEMV: integer block sums are exact on both sides, only the
/// order of the f32 block accumulation differs (measured ~1e-7).
pub(super) const GEMV_BOUND: f64 = 2e-6;

#[test]
fn cuda_gemv_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_gemv_matches_cpu");
    for dtype in TYPES {
        for (n, k, m) in [(512, 4096, 1), (1000, 2304, 3), (256, 1536, 8), (300, 512, 11)] {
            let bytes = random_weights(&mut rng, dtype, n, k);
            let x = randn(&mut rng, m * k, 2.0);
            let want = cpu_matmul(dtype, &bytes, &x, m, k, n);
            let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
            let fmt = ActFormat::for_weights(dtype).expect("supported");
            let mut act = DeviceAct::alloc(g, fmt, m, k).expect("alloc");
            let xd = up(g, &x);
            let mut y = nans(g, m * n);
            g.matmul(&w, &xd, &mut act, &mut y).expect("matmul");
            rel_err(&format!("gemv {dtype:?} n={n} k={k} m={m}"), &down(g, &y), &want, GEMV_BOUND);
        }
    }
}

/// Dequantized rows equal candle's (ggml's) dequantization; the same products in the
/// same order, so the bound is tight.
const EMBED_BOUND: f64 = 1e-7;

#[test]
fn cuda_embedding_rows_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_embedding_rows_match_cpu");
    let cpu = candle_core::Device::Cpu;
    for dtype in TYPES {
        let (n, k) = (97, 768);
        let bytes = random_weights(&mut rng, dtype, n, k);
        // The CPU engine's embedding tables: candle's dequantization, the IQ4 types' own.
        let table: Vec<Vec<f32>> = match dtype {
            Stored::Ggml(t) => candle_core::quantized::ggml_file::qtensor_from_ggml(t, &bytes, vec![n, k], &cpu)
                .expect("qtensor")
                .dequantize(&cpu)
                .expect("dequantize")
                .to_vec2::<f32>()
                .expect("rows"),
            _ => bytes.chunks_exact(bytes.len() / n).map(|row| dequantize_row(dtype, row)).collect(),
        };
        let mut ids: Vec<i32> = (0..9).map(|_| rng.random_range(0..n as i32)).collect();
        ids.extend([0, n as i32 - 1]);
        let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize].clone()).collect();
        let w = DeviceWeights::upload(g, MatrixBytes { name: "w", dtype, bytes: &bytes, k, n }).expect("upload");
        let mut out = nans(g, ids.len() * k);
        g.embed(&w, &up(g, &ids), &mut out).expect("embed");
        rel_err(&format!("embed {dtype:?} rows={}", ids.len()), &down(g, &out), &want, EMBED_BOUND);
    }
}

/// Activation quantization must equal the CPU's bit for bit (bound: 0 differences).
#[test]
fn cuda_quantize_matches_cpu_exactly() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_quantize_matches_cpu_exactly");
    for (rows, k) in [(1, 4096), (3, 2304), (8, 256)] {
        let mut x = randn(&mut rng, rows * k, 3.0);
        x[5] = 0.0;
        x[..32].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        x[300] = -x[300].abs() - 10.0; // a dominant negative value
        x[301] = -x[300]; // and its positive twin later: the first one decides
        let xd = up(g, &x);
        for fmt in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8K] {
            let mut act = DeviceAct::alloc(g, fmt, rows, k).expect("alloc");
            g.quantize(&xd, &mut act).expect("quantize");
            let (qs, d, s, bs) = (down(g, &act.qs), down(g, &act.d), down(g, &act.s), down(g, &act.bsums));
            let mut diffs = 0usize;
            if fmt == ActFormat::Q8K {
                for (i, b) in quantize_q8_k(&x, Q8KSign::FirstMax).iter().enumerate() {
                    diffs += b.qs.iter().zip(&qs[i * 256..]).filter(|(a, b)| a != b).count();
                    diffs += usize::from(b.d.to_bits() != d[i].to_bits());
                    diffs += b.bsums.iter().zip(&bs[i * 16..]).filter(|(a, b)| a != b).count();
                }
            } else {
                let cpu = if fmt == ActFormat::Q8_1 { quantize_q8_1(&x) } else { quantize_q8_0(&x) };
                for (i, b) in cpu.iter().enumerate() {
                    diffs += b.qs.iter().zip(&qs[i * 32..]).filter(|(a, b)| a != b).count();
                    diffs += usize::from(b.d.to_bits() != d[i].to_bits());
                    diffs += usize::from(fmt == ActFormat::Q8_1 && b.s.to_bits() != s[i].to_bits());
                }
            }
            println!("quantize {fmt:?} rows={rows} k={k}: {diffs} differences (bound 0)");
            assert_eq!(diffs, 0, "quantize {fmt:?} rows={rows} k={k}");
        }
        // The float formats: the values themselves, BF16's rounded as the CPU's kernel.
        for fmt in [ActFormat::F32, ActFormat::Bf16] {
            let mut act = DeviceAct::alloc(g, fmt, rows, k).expect("alloc");
            g.quantize(&xd, &mut act).expect("quantize");
            let round = |v: f32| if fmt == ActFormat::Bf16 { round_bf16(v) } else { v };
            let got = down(g, &act.d);
            let diffs = x.iter().zip(&got).filter(|(a, b)| round(**a).to_bits() != b.to_bits()).count();
            println!("quantize {fmt:?} rows={rows} k={k}: {diffs} differences (bound 0)");
            assert_eq!(diffs, 0, "quantize {fmt:?} rows={rows} k={k}");
        }
    }
}

/// Every kernel program compiles with NVRTC for Ampere and Hopper (no GPU needed). The
/// sources branch on the architecture only at sm_80, so Ada (sm_89) takes Ampere's code;
/// its own ptxas run would add a third of this test's minutes to CI for no new path.
#[test]
fn cuda_kernels_compile() {
    let present = Presence::probe().nvrtc;
    if !present {
        if std::env::var("CORRAL_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("CORRAL_REQUIRE_NVRTC=1 but {} is not on the library path", Library::Nvrtc);
        }
        println!("skipped: {} not found", Library::Nvrtc);
        return;
    }
    for arch in ["sm_80", "sm_90"] {
        for p in programs::ALL {
            let t = std::time::Instant::now();
            let cubin = compile_cubin(p, arch).unwrap_or_else(|e| panic!("{e}"));
            println!("{} for {arch}: {} bytes in {} ms", p.name, cubin.len(), t.elapsed().as_millis());
            assert!(cubin.len() > 1000);
        }
    }
}
