//! Flash-decoding (`flashdec.rs`) against the CPU's attention: decode rows on both
//! sides of the threshold in one pass (the one-query kernel beside the flash kernel),
//! GQA ratios 1 to 20 (more than one block of 16 query heads a KV head), head dims 64,
//! 96, 128 and 256, windows, sinks, rows past 32k positions cut into many splits merged
//! by the combine, the quantized output; and a row's result bit for bit the same alone
//! and beside others.

use cudarc::driver::DevicePtr;

use super::attention::SPLIT_MIN;
use super::ops::{ActFormat, DeviceAct};
use super::tests::{down, gpu, randn, rel_err, rng, up};
use crate::kernels::{AttnSpec, attention};
use crate::kv::{KvShape, SeqCache};

fn filled(rng: &mut rand::rngs::StdRng, shape: KvShape, n: usize) -> SeqCache {
    let mut c = SeqCache::new(shape);
    c.reserve(n);
    for layer in 0..shape.n_layers {
        let (k, v) = (randn(rng, n * shape.kv_dim, 1.0), randn(rng, n * shape.kv_dim, 1.0));
        c.write(layer, 0, &k, &v);
    }
    c.commit(n);
    c
}

/// One pass of decode rows (one new token each after `lens[i]` committed positions)
/// through the device, with the flash kernel (on sm_80 and later, whatever
/// `CORRAL_CUDA_FLASH` says) or the older split, and the CPU's attention of the same
/// rows. Returns (GPU, CPU) outputs, `[rows][n_heads][head_dim]`.
fn decode_pass(rng: &mut rand::rngs::StdRng, spec: &AttnSpec, lens: &[usize], flash: bool) -> (Vec<f32>, Vec<f32>) {
    let g = gpu().expect("checked by the caller");
    let shape = KvShape { n_layers: 1, kv_dim: spec.n_kv_heads * spec.head_dim };
    let (q_dim, d) = (spec.n_heads * spec.head_dim, shape.kv_dim);
    let mut caches: Vec<SeqCache> = lens.iter().map(|&n| filled(rng, shape, n)).collect();
    let mut cpu_caches = caches.clone();
    let q = randn(rng, lens.len() * q_dim, 1.0);
    let (k, v) = (randn(rng, lens.len() * d, 1.0), randn(rng, lens.len() * d, 1.0));
    let sinks_d = spec.sinks.map(|s| up(g, s));
    let sinks_at = sinks_d.as_ref().map_or(0, |s| s.device_ptr(&g.stream).0);
    let mut rows: Vec<(&mut SeqCache, usize)> = caches.iter_mut().map(|c| (c, 1)).collect();
    let mut kv = g.plan_kv(&mut rows, spec.head_dim).expect("plan");
    kv.flash = flash && g.has_mmq();
    g.kv_store(&mut kv, 0, &up(g, &k), &up(g, &v)).expect("kv_store");
    let got = down(g, &g.attention(&kv, 0, (&up(g, &q), sinks_at), spec, None).expect("attention"));
    let mut want = Vec::new();
    for (i, (c, &n)) in cpu_caches.iter_mut().zip(lens).enumerate() {
        c.reserve(1);
        c.write(0, n, &k[i * d..(i + 1) * d], &v[i * d..(i + 1) * d]);
        want.extend(attention(c, 0, n, &q[i * q_dim..(i + 1) * q_dim], spec));
    }
    (got, want)
}

#[test]
fn cuda_flash_decode_matches_cpu() {
    let Some(_) = gpu() else { return };
    let mut rng = rng("cuda_flash_decode_matches_cpu");
    // (query heads, KV heads, head_dim, window): GQA 1, 4, 8, 16 and 20 (two blocks of
    // query heads a KV head, the second of 4), head_dim 96 inside the 128 kernel.
    let shapes = [
        (8, 8, 128, None),
        (8, 2, 64, None),
        (16, 4, 128, Some(1000)),
        (16, 2, 256, None),
        (8, 1, 256, Some(SPLIT_MIN + 1)),
        (12, 2, 96, None),
        (32, 2, 64, Some(700)),
        (20, 1, 64, None),
    ];
    // Rows on both sides of the threshold in one pass (a row after n positions sees
    // n + 1 keys): the one-query kernel takes 101 and 512 keys, the flash kernel 513
    // (5 splits of at most 128 keys) and more; the window of 513 keys cuts its rows to
    // exactly the first length the flash kernel takes.
    let lens = [100, SPLIT_MIN - 1, SPLIT_MIN, 1300, 4200];
    for ((heads, kv_heads, hd, window), with_sinks) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let sink_values: Vec<f32> = randn(&mut rng, heads, 2.0).iter().map(|s| s + 1.0).collect();
        let sinks = with_sinks.then_some(&sink_values[..]);
        let spec = AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window, sinks };
        for flash in [true, false] {
            let (got, want) = decode_pass(&mut rng, &spec, &lens, flash);
            let path = if flash { "flash" } else { "older split" };
            let what = format!("{path} decode {heads}/{kv_heads}x{hd} window {window:?} sinks {with_sinks}");
            rel_err(&what, &got, &want, 2e-3);
        }
    }
}

/// Rows past 32k positions: 66 splits (8B's shape on 132 SMs) or up to 128, merged by
/// `flashdec_combine`. The CPU rounds each normalized probability (~1e-5 here) to f16,
/// where it is subnormal, so it is the less exact side: ~1e-3 apart (as the older
/// split kernel measured at 70,000 positions).
#[test]
fn cuda_flash_decode_long_rows() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_flash_decode_long_rows");
    for (heads, kv_heads, hd, window, lens) in [
        (32, 8, 128, None, vec![32_768, 40_000]),
        (4, 1, 256, Some(20_000), vec![33_000]),
        (8, 1, 64, None, vec![70_000]),
    ] {
        let sink_values: Vec<f32> = randn(&mut rng, heads, 2.0).iter().map(|s| s + 1.0).collect();
        let spec = AttnSpec {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            scale: 0.125,
            window,
            sinks: (heads == 4).then_some(&sink_values[..]),
        };
        let (got, want) = decode_pass(&mut rng, &spec, &lens, true);
        let what = format!("flash decode {heads}/{kv_heads}x{hd} after {lens:?} positions, window {window:?}");
        rel_err(&what, &got, &want, 3e-3);
        println!("  ({} SMs)", g.sms);
    }
}

/// A row's flash-decoded output is bit for bit the same alone, beside shorter and
/// longer rows, and at another place in the pass: its splits and their arithmetic
/// depend only on its own visible keys.
#[test]
fn cuda_flash_decode_row_alone_equals_in_company() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_flash_decode_row_alone_equals_in_company");
    for (heads, kv_heads, hd, window) in [(16, 4, 128, None), (8, 1, 256, Some(3000)), (32, 2, 64, None)] {
        let shape = KvShape { n_layers: 1, kv_dim: kv_heads * hd };
        let sink_values: Vec<f32> = randn(&mut rng, heads, 2.0).iter().map(|s| s + 1.0).collect();
        let spec = AttnSpec {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            scale: 0.125,
            window,
            sinks: Some(&sink_values),
        };
        let sinks_d = up(g, &sink_values);
        let sinks_at = sinks_d.device_ptr(&g.stream).0;
        let lens = [700, 40, 9000, 33_000, 2048];
        let caches: Vec<SeqCache> = lens.iter().map(|&n| filled(&mut rng, shape, n)).collect();
        let q_dim = heads * hd;
        let q = randn(&mut rng, lens.len() * q_dim, 1.0);
        let (k, v) = (randn(&mut rng, lens.len() * shape.kv_dim, 1.0), randn(&mut rng, lens.len() * shape.kv_dim, 1.0));
        // The outputs of rows `order` (indices into lens) attended in one pass, by row.
        let run = |order: &[usize]| -> Vec<Vec<u32>> {
            let mut cs: Vec<SeqCache> = order.iter().map(|&i| caches[i].clone()).collect();
            let mut rows: Vec<(&mut SeqCache, usize)> = cs.iter_mut().map(|c| (c, 1)).collect();
            let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
            let d = shape.kv_dim;
            let pick =
                |x: &[f32], w: usize| order.iter().flat_map(|&i| x[i * w..(i + 1) * w].to_vec()).collect::<Vec<_>>();
            g.kv_store(&mut kv, 0, &up(g, &pick(&k, d)), &up(g, &pick(&v, d))).expect("kv_store");
            let out = g.attention(&kv, 0, (&up(g, &pick(&q, q_dim)), sinks_at), &spec, None).expect("attention");
            down(g, &out).chunks(q_dim).map(|r| r.iter().map(|f| f.to_bits()).collect()).collect()
        };
        let together = run(&[0, 1, 2, 3, 4]);
        let reversed = run(&[4, 3, 2, 1, 0]);
        for (i, n) in lens.iter().enumerate() {
            let alone = run(&[i]);
            assert_eq!(alone[0], together[i], "{heads}/{kv_heads}x{hd}: row after {n} alone vs in company");
            assert_eq!(alone[0], reversed[lens.len() - 1 - i], "{heads}/{kv_heads}x{hd}: row after {n} reordered");
        }
        println!("flash decode {heads}/{kv_heads}x{hd} window {window:?}: every row alone = in company, bit for bit");
    }
}

/// Through the flash kernel's combine, the quantized output (Q8_0 and Q8_1) is exactly
/// `quantize` of the f32 output, and the f32 output is the same with and without it.
#[test]
fn cuda_flash_decode_quantized_output_equals_quantize() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_flash_decode_quantized_output_equals_quantize");
    for (heads, kv_heads, hd) in [(32, 8, 128), (8, 1, 64), (8, 4, 256)] {
        let shape = KvShape { n_layers: 1, kv_dim: kv_heads * hd };
        let spec =
            AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window: None, sinks: None };
        let lens = [3000, 12, 600];
        let mut caches: Vec<SeqCache> = lens.iter().map(|&n| filled(&mut rng, shape, n)).collect();
        let q = up(g, &randn(&mut rng, lens.len() * heads * hd, 1.0));
        let (k, v) = (randn(&mut rng, lens.len() * shape.kv_dim, 1.0), randn(&mut rng, lens.len() * shape.kv_dim, 1.0));
        let mut rows: Vec<(&mut SeqCache, usize)> = caches.iter_mut().map(|c| (c, 1)).collect();
        let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
        g.kv_store(&mut kv, 0, &up(g, &k), &up(g, &v)).expect("kv_store");
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for format in [ActFormat::Q8_0, ActFormat::Q8_1] {
            let a = g.attention(&kv, 0, (&q, 0), &spec, None).expect("attention");
            let mut want = DeviceAct::alloc(g, format, lens.len(), heads * hd).expect("alloc");
            g.quantize(&a, &mut want).expect("quantize");
            let mut got = DeviceAct::alloc(g, format, lens.len(), heads * hd).expect("alloc");
            let a2 = g.attention(&kv, 0, (&q, 0), &spec, Some(&mut got)).expect("attention quantized");
            assert_eq!(bits(&down(g, &a)), bits(&down(g, &a2)), "{heads}/{kv_heads}x{hd}: f32 output");
            assert_eq!(down(g, &want.qs), down(g, &got.qs), "{heads}/{kv_heads}x{hd} {format:?}: values");
            assert_eq!(bits(&down(g, &want.d)), bits(&down(g, &got.d)), "{heads}/{kv_heads}x{hd} {format:?}: scales");
            if format == ActFormat::Q8_1 {
                assert_eq!(bits(&down(g, &want.s)), bits(&down(g, &got.s)), "{heads}/{kv_heads}x{hd}: sums");
            }
            println!("flash decode {heads}/{kv_heads}x{hd} quantized to {format:?}: equal to quantize");
        }
    }
}
