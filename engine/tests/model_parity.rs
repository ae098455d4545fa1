//! Model forward against llama.cpp's greedy continuations (fixtures from
//! scripts/oracle/run): teacher-forced argmax agreement and free-running greedy.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::model::{Logits, Model};

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
        })
        .collect()
}

fn teacher_forced(model_file: &str, fixture_name: &str) {
    let model = Model::load(&Gguf::open(&model_path(model_file)).unwrap()).unwrap();
    let (mut agree, mut total) = (0, 0);
    let mut report = Vec::new();
    for case in cases(fixture_name) {
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
    }
    let rate = agree as f64 / total as f64;
    eprintln!("{model_file}: teacher-forced argmax agreement {agree}/{total} = {:.2}%", rate * 100.0);
    for r in &report {
        eprintln!("  {r}");
    }
    assert!(rate >= 0.98, "{model_file}: agreement {:.2}% < 98%", rate * 100.0);
}

fn free_running(model_file: &str, fixture_name: &str) {
    let model = Model::load(&Gguf::open(&model_path(model_file)).unwrap()).unwrap();
    let mut exact = 0;
    let all = cases(fixture_name);
    for case in &all {
        let mut cache = model.new_cache();
        let mut logits = prefill(&model, &mut cache, &case.prompt);
        let mut ours = Vec::new();
        for _ in 0..32 {
            let t = argmax(&logits);
            ours.push(t);
            logits = model.forward(&[t], &mut cache, Logits::Last).unwrap();
        }
        let ok = ours[..] == case.tokens[..32];
        match ours.iter().zip(&case.tokens).position(|(a, b)| a != b) {
            None => eprintln!("{model_file} {}: first 32 greedy tokens match", case.name),
            Some(i) => eprintln!(
                "{model_file} {}: greedy differs at token {i} (llama.cpp's margin there {})",
                case.name, case.margins[i]
            ),
        }
        exact += ok as usize;
    }
    assert!(all.len() >= 6);
    assert!(
        exact + 1 >= all.len() && exact >= 5,
        "{model_file}: only {exact}/{} prompts reproduce 32 tokens",
        all.len()
    );
}

#[test]
fn smollm2_teacher_forced_agrees_with_llama_cpp() {
    teacher_forced(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_teacher_forced_agrees_with_llama_cpp() {
    teacher_forced(GEMMA, "oracle-gemma3.json");
}

#[test]
fn smollm2_free_running_greedy_matches_llama_cpp() {
    free_running(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_free_running_greedy_matches_llama_cpp() {
    free_running(GEMMA, "oracle-gemma3.json");
}
