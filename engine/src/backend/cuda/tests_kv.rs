//! The device KV mirror and attention against the CPU: sequences with committed
//! positions (uploaded from the host blocks) plus new tokens (stored on the device),
//! GQA, a sliding window, and the staging copy that goes back to the host cache.

use cudarc::driver::DevicePtr;
use half::f16;

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

#[test]
fn cuda_attention_over_the_device_kv() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_attention_over_the_device_kv");
    // head_dim 64 and 128 take the tensor-core prefill kernel, 256 and 96 the SIMT one;
    // decode rows the one-query kernel for 64, 128 (96 inside it) or 256 dimensions.
    let shapes = [
        (9, 3, 64, None),
        (4, 1, 256, Some(40)),
        (8, 8, 128, None),
        (8, 2, 128, Some(50)),
        (4, 4, 64, Some(7)),
        (6, 2, 96, None),
        (4, 2, 128, Some(1000)),
    ];
    // Each shape without and with a sink logit per head (gpt-oss), some above the
    // scores' maximum and some below: in the one-query kernel, the split rows' combine,
    // and both prefill kernels.
    for ((heads, kv_heads, hd, window), with_sinks) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let shape = KvShape { n_layers: 2, kv_dim: kv_heads * hd };
        let sink_values: Vec<f32> = randn(&mut rng, heads, 2.0).iter().map(|s| s + 1.0).collect();
        let sinks = with_sinks.then_some(&sink_values[..]);
        let spec = AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window, sinks };
        let sinks_d = sinks.map(|s| up(g, s));
        let sinks_at = sinks_d.as_ref().map_or(0, |s| s.device_ptr(&g.stream).0);
        // (committed positions, new tokens) per sequence: decode rows and a prefill row.
        // Prefill rows take the tiled kernel: query tiles (32, or 16 at head_dim 256)
        // ending mid-tile, key tiles of 32 starting before the window. The decode row
        // after 4,200 positions is split over 15 blocks a head (or 4 under the window
        // of 1,000; windows of 40-50 keep it whole), the rows after 70 and 100 are not.
        let plan = [(0, 5), (70, 1), (33, 40), (100, 1), (200, 33), (4200, 1)];
        let mut caches: Vec<SeqCache> = plan.iter().map(|&(n, _)| filled(&mut rng, shape, n)).collect();
        let mut cpu_caches = caches.clone();
        let total: usize = plan.iter().map(|p| p.1).sum();
        let layer = 1;
        let q = randn(&mut rng, total * heads * hd, 1.0);
        let (k, v) = (randn(&mut rng, total * shape.kv_dim, 1.0), randn(&mut rng, total * shape.kv_dim, 1.0));

        let mut rows: Vec<(&mut SeqCache, usize)> = caches.iter_mut().zip(&plan).map(|(c, p)| (c, p.1)).collect();
        let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
        g.kv_store(&mut kv, layer, &up(g, &k), &up(g, &v)).expect("kv_store");
        let got = down(g, &g.attention(&kv, layer, (&up(g, &q), sinks_at), &spec, None).expect("attention"));
        let stage: Vec<f16> = down(g, &kv.stage);

        let (mut want, mut at) = (Vec::new(), 0);
        for (c, &(n0, n)) in cpu_caches.iter_mut().zip(&plan) {
            let d = shape.kv_dim;
            c.reserve(n);
            c.write(layer, n0, &k[at * d..(at + n) * d], &v[at * d..(at + n) * d]);
            want.extend(attention(c, layer, n0, &q[at * heads * hd..(at + n) * heads * hd], &spec));
            // What goes back to the host is K and V rounded to f16, at the pass's rows.
            let staged = |which: usize| &stage[((layer * 2 + which) * total + at) * d..][..n * d];
            let rounded = |x: &[f32]| x.iter().map(|&f| f16::from_f32(f)).collect::<Vec<_>>();
            assert_eq!(staged(0), rounded(&k[at * d..(at + n) * d]).as_slice(), "staged K");
            assert_eq!(staged(1), rounded(&v[at * d..(at + n) * d]).as_slice(), "staged V");
            at += n;
        }
        let what = format!("attention {heads}/{kv_heads}x{hd} window {window:?} sinks {with_sinks}");
        rel_err(&what, &got, &want, 2e-3);
    }
}

/// A decode row after 70,000 positions through the older split (flash-decoding off, as
/// on devices before sm_80): 16 splits of 4,384 keys, more than a block keeps scores for
/// (ATT_SMAX, 4,096), so each split's second pass computes them again.
#[test]
fn cuda_attention_long_split_recomputes_scores() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_attention_long_split_recomputes_scores");
    let (heads, kv_heads, hd, n) = (2, 1, 64, 70_000);
    let shape = KvShape { n_layers: 1, kv_dim: kv_heads * hd };
    let spec = AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window: None, sinks: None };
    let mut c = filled(&mut rng, shape, n);
    let mut cpu = c.clone();
    let q = randn(&mut rng, heads * hd, 1.0);
    let (k, v) = (randn(&mut rng, shape.kv_dim, 1.0), randn(&mut rng, shape.kv_dim, 1.0));
    let mut kv = g.plan_kv(&mut [(&mut c, 1)], hd).expect("plan");
    kv.flash = false;
    g.kv_store(&mut kv, 0, &up(g, &k), &up(g, &v)).expect("kv_store");
    let got = down(g, &g.attention(&kv, 0, (&up(g, &q), 0), &spec, None).expect("attention"));
    cpu.reserve(1);
    cpu.write(0, n, &k, &v);
    rel_err("attention after 70,000 positions", &got, &attention(&cpu, 0, n, &q, &spec), 2e-3);
}

/// A mirror follows its host cache: truncated, grown past its capacity, or missing (a
/// clone, as the prompt cache hands out), the next pass sees exactly the host's K/V.
#[test]
fn cuda_kv_mirror_follows_truncate_growth_and_clones() {
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_kv_mirror_follows_truncate_growth_and_clones");
    let (heads, hd) = (2, 64);
    let shape = KvShape { n_layers: 1, kv_dim: hd };
    let spec = AttnSpec { n_heads: heads, n_kv_heads: 1, head_dim: hd, scale: 0.125, window: None, sinks: None };
    let q = randn(&mut rng, heads * hd, 1.0);
    let attend_last = |c: &mut SeqCache| {
        // Re-attend the last committed position as a new token with its own K/V.
        let n = c.len() - 1;
        let mut host = c.clone();
        host.truncate(n);
        let (k, v) = {
            let (kb, vb) = c.block_kv(0, n / crate::kv::BLOCK_TOKENS);
            let s = (n % crate::kv::BLOCK_TOKENS) * hd;
            (
                kb[s..s + hd].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                vb[s..s + hd].iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            )
        };
        c.truncate(n);
        let mut rows = [(&mut *c, 1)];
        let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
        g.kv_store(&mut kv, 0, &up(g, &k), &up(g, &v)).expect("kv_store");
        let got = down(g, &g.attention(&kv, 0, (&up(g, &q), 0), &spec, None).expect("attention"));
        host.reserve(1);
        host.write(0, n, &k, &v);
        c.reserve(1);
        c.write(0, n, &k, &v);
        c.commit(1);
        (got, attention(&host, 0, n, &q, &spec))
    };
    let mut c = filled(&mut rng, shape, 300);
    let (got, want) = attend_last(&mut c);
    rel_err("fresh mirror", &got, &want, 2e-3);
    let mut extend = |c: &mut SeqCache, n: usize| {
        let (k, v) = (randn(&mut rng, n * hd, 1.0), randn(&mut rng, n * hd, 1.0));
        let at = c.len();
        c.reserve(n);
        c.write(0, at, &k, &v);
        c.commit(n);
    };
    // Truncated to 120 and refilled: positions 120.. must come from the host again.
    c.truncate(120);
    extend(&mut c, 100);
    let (got, want) = attend_last(&mut c);
    rel_err("truncated and refilled", &got, &want, 2e-3);
    // Past the mirror's first capacity (512): reallocated, the positions it held copied on
    // the device, the rest uploaded from the host.
    extend(&mut c, 400);
    let (got, want) = attend_last(&mut c);
    rel_err("grown", &got, &want, 2e-3);
    let mut clone = c.clone();
    let (got, want) = attend_last(&mut clone);
    rel_err("clone without mirror", &got, &want, 2e-3);
}

/// `rope_kv_store` (one launch) gives exactly `rope_qk` then `kv_store`: the same
/// rotated queries, the same staged K/V and mirror (so the same attention), for both
/// pairings, GQA, decode rows and a prefill row.
#[test]
fn cuda_rope_kv_store_equals_rope_then_store() {
    use super::ops::RopeSpec;
    use crate::kernels::rope::RopeStyle;
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_rope_kv_store_equals_rope_then_store");
    for (heads, kv_heads, hd, style) in
        [(9, 3, 64, RopeStyle::Interleaved), (8, 8, 128, RopeStyle::Neox), (4, 1, 256, RopeStyle::Interleaved)]
    {
        let shape = KvShape { n_layers: 2, kv_dim: kv_heads * hd };
        let spec =
            AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window: None, sinks: None };
        let rope = RopeSpec { heads, head_dim: hd, base: 10000.0, style, scaled: None };
        let plan = [(0, 5), (70, 1), (1000, 40), (3000, 1)];
        let caches: Vec<SeqCache> = plan.iter().map(|&(n, _)| filled(&mut rng, shape, n)).collect();
        let total: usize = plan.iter().map(|p| p.1).sum();
        let layer = 1;
        let q = randn(&mut rng, total * heads * hd, 1.0);
        let (k, v) = (randn(&mut rng, total * shape.kv_dim, 1.0), randn(&mut rng, total * shape.kv_dim, 1.0));
        let mut outs = Vec::new();
        for fused in [false, true] {
            let mut cs = caches.clone();
            let mut rows: Vec<(&mut SeqCache, usize)> = cs.iter_mut().zip(&plan).map(|(c, p)| (c, p.1)).collect();
            let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
            let (mut qd, mut kd, vd) = (up(g, &q), up(g, &k), up(g, &v));
            if fused {
                g.rope_kv_store(&mut kv, layer, (&mut qd, &mut kd, &vd), kv_heads, rope).expect("rope_kv_store");
            } else {
                g.rope_qk((&mut qd, &mut kd), kv_heads, &kv.tok_pos, rope).expect("rope_qk");
                g.kv_store(&mut kv, layer, &kd, &vd).expect("kv_store");
            }
            let att = down(g, &g.attention(&kv, layer, (&qd, 0), &spec, None).expect("attention"));
            let stage: Vec<f16> = down(g, &kv.stage);
            outs.push((down(g, &qd), stage, att));
        }
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&outs[0].0), bits(&outs[1].0), "{heads}/{kv_heads}x{hd}: rotated q");
        assert_eq!(outs[0].1, outs[1].1, "{heads}/{kv_heads}x{hd}: staged K/V");
        assert_eq!(bits(&outs[0].2), bits(&outs[1].2), "{heads}/{kv_heads}x{hd}: attention");
        println!("rope_kv_store {heads}/{kv_heads}x{hd} {style:?}: equal to rope_qk + kv_store");
    }
}

/// The one-query kernel's quantized output (a pass of decode rows, Q8_0 and Q8_1) is
/// exactly `quantize` of its f32 output; a pass with a prefill row is refused.
#[test]
fn cuda_attention_quantized_output_equals_quantize() {
    use super::ops::{ActFormat, DeviceAct};
    let Some(g) = gpu() else { return };
    let mut rng = rng("cuda_attention_quantized_output_equals_quantize");
    for (heads, kv_heads, hd) in [(9, 3, 64), (8, 2, 128), (4, 1, 256)] {
        let shape = KvShape { n_layers: 1, kv_dim: kv_heads * hd };
        let spec =
            AttnSpec { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125, window: None, sinks: None };
        let plan = [(70, 1), (0, 1), (4200, 1)];
        let mut caches: Vec<SeqCache> = plan.iter().map(|&(n, _)| filled(&mut rng, shape, n)).collect();
        let q = up(g, &randn(&mut rng, plan.len() * heads * hd, 1.0));
        let (k, v) = (randn(&mut rng, plan.len() * shape.kv_dim, 1.0), randn(&mut rng, plan.len() * shape.kv_dim, 1.0));
        let mut rows: Vec<(&mut SeqCache, usize)> = caches.iter_mut().zip(&plan).map(|(c, p)| (c, p.1)).collect();
        let mut kv = g.plan_kv(&mut rows, hd).expect("plan");
        g.kv_store(&mut kv, 0, &up(g, &k), &up(g, &v)).expect("kv_store");
        for format in [ActFormat::Q8_0, ActFormat::Q8_1] {
            let a = g.attention(&kv, 0, (&q, 0), &spec, None).expect("attention");
            let mut want = DeviceAct::alloc(g, format, plan.len(), heads * hd).expect("alloc");
            g.quantize(&a, &mut want).expect("quantize");
            let mut got = DeviceAct::alloc(g, format, plan.len(), heads * hd).expect("alloc");
            let a2 = g.attention(&kv, 0, (&q, 0), &spec, Some(&mut got)).expect("attention quantized");
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&down(g, &a)), bits(&down(g, &a2)), "{heads}/{kv_heads}x{hd}: f32 output");
            assert_eq!(down(g, &want.qs), down(g, &got.qs), "{heads}/{kv_heads}x{hd} {format:?}: values");
            assert_eq!(bits(&down(g, &want.d)), bits(&down(g, &got.d)), "{heads}/{kv_heads}x{hd} {format:?}: scales");
            if format == ActFormat::Q8_1 {
                assert_eq!(bits(&down(g, &want.s)), bits(&down(g, &got.s)), "{heads}/{kv_heads}x{hd}: sums");
            }
            println!("attention {heads}/{kv_heads}x{hd} quantized to {format:?}: equal to quantize");
        }
    }
    let shape = KvShape { n_layers: 1, kv_dim: 128 };
    let spec = AttnSpec { n_heads: 2, n_kv_heads: 1, head_dim: 128, scale: 0.125, window: None, sinks: None };
    let mut c = filled(&mut rng, shape, 3);
    let mut kv = g.plan_kv(&mut [(&mut c, 4)], 128).expect("plan");
    let (k, v) = (up(g, &randn(&mut rng, 4 * 128, 1.0)), up(g, &randn(&mut rng, 4 * 128, 1.0)));
    g.kv_store(&mut kv, 0, &k, &v).expect("kv_store");
    let mut act = DeviceAct::alloc(g, ActFormat::Q8_0, 4, 256).expect("alloc");
    let q = up(g, &randn(&mut rng, 4 * 256, 1.0));
    assert!(g.attention(&kv, 0, (&q, 0), &spec, Some(&mut act)).is_err(), "a prefill row cannot be quantized in place");
}
