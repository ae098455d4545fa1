//! Model forward against llama.cpp's greedy continuations (fixtures from
//! scripts/models/oracle/run): teacher-forced argmax agreement and free-running greedy, with
//! llama.cpp's own batch-dependent arithmetic and with corral's default batch-invariant
//! arithmetic (llama.cpp's one-row path for every row); and the invariance itself: a
//! prompt split anywhere gives bit-identical logits.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::kernels::Numerics;
use corral_engine::model::{Logits, Model};

fn load(model_file: &str, numerics: Numerics) -> Model {
    let mut m = Model::load(&Gguf::open(&model_path(model_file)).unwrap()).unwrap();
    m.set_numerics(numerics);
    m
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill in 512-token chunks (as generation does) and return the last row's logits.
fn prefill(model: &Model, cache: &mut corral_engine::kv::SeqCache, ids: &[u32]) -> Vec<f32> {
    let chunks: Vec<&[u32]> = ids.chunks(512).collect();
    let mut last = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let mode = if i + 1 == chunks.len() { Logits::Last } else { Logits::None };
        last = model.forward(c, cache, mode).unwrap();
    }
    last
}

struct Case {
    name: String,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<f64>,
    /// llama.cpp's greedy output when the prompt is fed one token at a time.
    serial_tokens: Vec<u32>,
    serial_margins: Vec<f64>,
}

fn cases(fixture_name: &str) -> Vec<Case> {
    fixture(fixture_name)["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| Case {
            name: g["name"].as_str().unwrap().to_owned(),
            prompt: ids(&g["prompt_ids"]),
            tokens: ids(&g["tokens"]),
            margins: g["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
            serial_tokens: ids(&g["serial_tokens"]),
            serial_margins: g["serial_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
        })
        .collect()
}

/// Teacher-forced argmax agreement over every position, and free-running greedy over
/// the first 32, from one run: where the first `i` tokens equal llama.cpp's, feeding them
/// back (free-running) is the very computation teacher forcing does, so the first 32
/// greedy tokens match exactly when the first 32 teacher-forced argmaxes do, and the
/// first difference is at the same token.
fn greedy_agrees_with_llama_cpp(model_file: &str, fixture_name: &str) {
    let model = load(model_file, Numerics::LlamaCpp);
    let (mut agree, mut total, mut exact) = (0, 0, 0);
    let mut report = Vec::new();
    let all = cases(fixture_name);
    for case in &all {
        let mut cache = model.new_cache();
        let first = prefill(&model, &mut cache, &case.prompt);
        let mut ours = vec![argmax(&first)];
        // Token by token, as llama.cpp produced the continuation.
        for &t in &case.tokens[..case.tokens.len() - 1] {
            ours.push(argmax(&model.forward(&[t], &mut cache, Logits::Last).unwrap()));
        }
        let mut case_agree = 0;
        for (i, (a, b)) in ours.iter().zip(&case.tokens).enumerate() {
            if a == b {
                case_agree += 1;
            } else {
                report.push(format!("{} pos {i}: ours {a} llama.cpp {b} (its margin {})", case.name, case.margins[i]));
            }
        }
        agree += case_agree;
        total += case.tokens.len();
        match ours[..32].iter().zip(&case.tokens[..32]).position(|(a, b)| a != b) {
            None => {
                exact += 1;
                eprintln!("{model_file} {}: first 32 greedy tokens match", case.name);
            }
            Some(i) => eprintln!(
                "{model_file} {}: greedy differs at token {i} (llama.cpp's margin there {})",
                case.name, case.margins[i]
            ),
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!("{model_file}: teacher-forced argmax agreement {agree}/{total} = {:.2}%", rate * 100.0);
    for r in &report {
        eprintln!("  {r}");
    }
    assert!(rate >= 0.98, "{model_file}: agreement {:.2}% < 98%", rate * 100.0);
    assert!(all.len() >= 6);
    assert!(
        exact + 1 >= all.len() && exact >= 5,
        "{model_file}: only {exact}/{} prompts reproduce 32 tokens",
        all.len()
    );
}

/// corral's default batch-invariant arithmetic against llama.cpp's serial path (the
/// prompt fed one token at a time): the first 32 greedy tokens.
fn batch_invariant_greedy(model_file: &str, fixture_name: &str) {
    let model = load(model_file, Numerics::BatchInvariant);
    let mut exact = 0;
    let all = cases(fixture_name);
    for case in &all {
        let (want, margins) = (&case.serial_tokens, &case.serial_margins);
        let mut cache = model.new_cache();
        let mut logits = prefill(&model, &mut cache, &case.prompt);
        let mut ours = Vec::new();
        for _ in 0..32 {
            let t = argmax(&logits);
            ours.push(t);
            logits = model.forward(&[t], &mut cache, Logits::Last).unwrap();
        }
        match ours.iter().zip(want).position(|(a, b)| a != b) {
            None => {
                exact += 1;
                eprintln!("{model_file} batch-invariant {}: first 32 greedy tokens match", case.name);
            }
            Some(i) => eprintln!(
                "{model_file} batch-invariant {}: greedy differs at token {i} (llama.cpp's margin there {})",
                case.name, margins[i]
            ),
        }
    }
    assert!(all.len() >= 6);
    assert!(
        exact + 1 >= all.len() && exact >= 5,
        "{model_file}: only {exact}/{} prompts reproduce 32 tokens",
        all.len()
    );
}

#[test]
fn smollm2_greedy_agrees_with_llama_cpp() {
    greedy_agrees_with_llama_cpp(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_greedy_agrees_with_llama_cpp() {
    greedy_agrees_with_llama_cpp(GEMMA, "oracle-gemma3.json");
}

#[test]
fn smollm2_batch_invariant_greedy_matches_llama_cpp() {
    batch_invariant_greedy(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_batch_invariant_greedy_matches_llama_cpp() {
    batch_invariant_greedy(GEMMA, "oracle-gemma3.json");
}

/// The property the prompt cache stands on: in the default arithmetic, where a prompt
/// is split (cached prefix + computed rest, prefill chunks, or token by token) does not
/// change a single bit of the logits.
fn split_anywhere_is_bit_identical(model_file: &str, fixture_name: &str) {
    let model = load(model_file, Numerics::BatchInvariant);
    for case in cases(fixture_name).iter().take(3) {
        let p = &case.prompt;
        let mut whole_cache = model.new_cache();
        let whole = model.forward(p, &mut whole_cache, Logits::Last).unwrap();
        for split in [1, p.len() / 2, p.len() - 1] {
            let mut cache = model.new_cache();
            model.forward(&p[..split], &mut cache, Logits::None).unwrap();
            let rest = model.forward(&p[split..], &mut cache, Logits::Last).unwrap();
            assert!(rest == whole, "{model_file} {}: logits differ when split at {split}", case.name);
        }
        // Generated tokens' K/V (computed one at a time) equal a batch recomputation's.
        let t = argmax(&whole);
        let mut step = whole_cache.clone();
        let next_step = model.forward(&[t], &mut step, Logits::Last).unwrap();
        let mut with_t = p.clone();
        with_t.push(t);
        let mut cache = model.new_cache();
        let next_batch = model.forward(&with_t, &mut cache, Logits::Last).unwrap();
        assert!(next_step == next_batch, "{model_file} {}: decode and batch disagree", case.name);
    }
}

#[test]
fn smollm2_split_anywhere_is_bit_identical() {
    split_anywhere_is_bit_identical(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_split_anywhere_is_bit_identical() {
    split_anywhere_is_bit_identical(GEMMA, "oracle-gemma3.json");
}
