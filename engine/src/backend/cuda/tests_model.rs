//! Whole models on the GPU against the CPU engine (the oracle), on the GGUF files named
//! by `CORRAL_GPU_MODELS` (colon-separated; `scripts/test-gpu` makes deterministic
//! llama- and gemma3-shaped ones with `scripts/make-gguf`): teacher-forced top-1
//! agreement, greedy continuations of a fixed prompt set, and batched = serial on the
//! GPU. The reference is computed by the CPU engine in the same run, on the same file.

use std::path::PathBuf;

use super::tests::gpu;
use crate::backend::DeviceChoice;
use crate::gguf::Gguf;
use crate::model::{Logits, Model, Row};

fn models() -> Vec<PathBuf> {
    let paths: Vec<PathBuf> =
        std::env::var("CORRAL_GPU_MODELS").unwrap_or_default().split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect();
    if paths.is_empty() {
        println!("skipped: CORRAL_GPU_MODELS names no model files");
    }
    paths
}

fn load(path: &PathBuf) -> (Model, Model) {
    let g = Gguf::open(path).expect("model file");
    let cpu = Model::load_on(&g, DeviceChoice::Cpu).expect("CPU load");
    let gpu = Model::load_on(&g, DeviceChoice::Cuda(0)).expect("GPU load");
    assert_eq!(gpu.device().label(), "cuda:0");
    (cpu, gpu)
}

/// Deterministic token ids in `[3, vocab)` (no specials).
fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            3 + (x % (vocab as u64 - 3)) as u32
        })
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = m.new_cache();
    let mut logits = m.forward(prompt, &mut cache, Logits::Last).expect("prefill");
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = m.forward(&[t], &mut cache, Logits::Last).expect("decode");
    }
    out
}

#[test]
fn cuda_model_teacher_forced_top1_matches_cpu() {
    if gpu().is_none() {
        return;
    }
    for path in models() {
        let (cpu, gpu) = load(&path);
        let vocab = cpu.config().vocab;
        let toks = tokens(7, 200, vocab);
        let (mut cc, mut gc) = (cpu.new_cache(), gpu.new_cache());
        let (mut agree, mut n, mut worst) = (0, 0, 0f64);
        let mut at = 0;
        // Chunks of different sizes: prefill, a single decode step, more prefill.
        for len in [64, 1, 100, 35] {
            let chunk = &toks[at..at + len];
            let want = cpu.forward(chunk, &mut cc, Logits::All).expect("CPU forward");
            let got = gpu.forward(chunk, &mut gc, Logits::All).expect("GPU forward");
            assert_eq!(got.len(), want.len());
            for (g, w) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)) {
                assert!(g.iter().all(|v| v.is_finite()), "non-finite GPU logits");
                agree += usize::from(argmax(g) == argmax(w));
                n += 1;
                let num: f64 = g.iter().zip(w).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
                let den: f64 = w.iter().map(|b| (*b as f64).powi(2)).sum();
                worst = worst.max((num / den).sqrt());
            }
            at += len;
        }
        assert_eq!((gc.len(), cc.len()), (200, 200));
        let rate = agree as f64 / n as f64;
        println!("{}: teacher-forced top-1 agreement {agree}/{n} ({:.1} %), worst logits rel err {worst:.2e}", path.display(), rate * 100.0);
        assert!(rate >= 0.99, "top-1 agreement {rate:.3} < 0.99");
    }
}

#[test]
fn cuda_model_greedy_continuations_match_cpu() {
    if gpu().is_none() {
        return;
    }
    for path in models() {
        let (cpu, gpu) = load(&path);
        let vocab = cpu.config().vocab;
        let lens = [1, 7, 33, 64, 100, 150, 250, 31];
        let mut same = 0;
        for (i, &len) in lens.iter().enumerate() {
            let prompt = tokens(100 + i as u64, len, vocab);
            let (want, got) = (greedy(&cpu, &prompt, 24), greedy(&gpu, &prompt, 24));
            match want.iter().zip(&got).position(|(a, b)| a != b) {
                None => same += 1,
                Some(at) => println!("{}: prompt {i} ({len} tokens) diverges at token {at}", path.display()),
            }
        }
        println!("{}: {same}/{} greedy continuations identical to the CPU", path.display(), lens.len());
        assert!(same * 4 >= lens.len() * 3, "only {same}/{} continuations match", lens.len());
    }
}

#[test]
fn cuda_model_batched_equals_serial() {
    if gpu().is_none() {
        return;
    }
    for path in models() {
        let (_, gpu) = load(&path);
        let vocab = gpu.config().vocab;
        let prompts: Vec<Vec<u32>> = [5, 40, 1, 77].iter().enumerate().map(|(i, &n)| tokens(300 + i as u64, n, vocab)).collect();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&gpu, p, 12)).collect();
        // The same rows together: prefills in one pass, then every decode step batched.
        let mut caches: Vec<_> = prompts.iter().map(|_| gpu.new_cache()).collect();
        let mut rows: Vec<Row<'_>> = caches
            .iter_mut()
            .zip(&prompts)
            .map(|(c, p)| Row { tokens: p, cache: c, logits: Logits::Last })
            .collect();
        let mut logits = gpu.forward_batch(&mut rows).expect("batched prefill");
        drop(rows);
        let mut together: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
        for _ in 0..12 {
            let next: Vec<[u32; 1]> = logits.iter().map(|l| [argmax(l)]).collect();
            for (out, t) in together.iter_mut().zip(&next) {
                out.push(t[0]);
            }
            let mut rows: Vec<Row<'_>> = caches
                .iter_mut()
                .zip(&next)
                .map(|(c, t)| Row { tokens: t, cache: c, logits: Logits::Last })
                .collect();
            logits = gpu.forward_batch(&mut rows).expect("batched decode");
        }
        assert_eq!(together, alone, "{}: batched rows differ from the same rows alone", path.display());
        println!("{}: batched = serial on the GPU for {} rows", path.display(), prompts.len());
    }
}
