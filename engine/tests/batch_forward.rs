//! The batched forward: several sequences at different positions, some prefilling and
//! some decoding, in one pass. Every row's logits must be bit-identical to the same
//! tokens run alone on the same cache (the property batching stands on), on both
//! models, and a batched greedy decode must produce each row's serial tokens. The same
//! for make-gguf's tiny qwen3moe and gpt-oss (mixtures of experts: rows of a pass share
//! experts, and a row's result must not depend on which; gpt-oss's rows also cross its
//! sliding window at different positions) and the Qwen3.5 hybrids qwen35 and qwen35moe
//! (each row's recurrent state its own; qwen35moe's shared expert runs on every row), when
//! they have been generated.

mod common;

use common::*;
use corral_engine::gguf::Gguf;
use corral_engine::kv::SeqCache;
use corral_engine::model::{Logits, Model, Row};

fn load(file: &str) -> Model {
    Model::load(&Gguf::open(&model_path(file)).unwrap()).unwrap()
}

fn prompts(fixture_name: &str) -> Vec<Vec<u32>> {
    let f = fixture(fixture_name);
    f["greedy"].as_array().unwrap().iter().take(4).map(|g| ids(&g["prompt_ids"])).collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Mixed rows: a fresh prefill, a prefill that continues a cached prefix, a one-token
/// decode, and an `All`-logits scoring row.
fn mixed_rows_equal_their_solo_runs(file: &str, fixture_name: &str) {
    mixed_rows_of(&load(file), file, &prompts(fixture_name));
}

fn mixed_rows_of(model: &Model, file: &str, p: &[Vec<u32>]) {
    // Cache states to start from: nothing, a prefix, all but the last token.
    let start = |prefix: &[u32]| -> SeqCache {
        let mut c = model.new_cache();
        model.forward(prefix, &mut c, Logits::None).unwrap();
        c
    };
    let plans: Vec<(Vec<u32>, usize, Logits)> = vec![
        (p[0].clone(), 0, Logits::Last),
        (p[1].clone(), p[1].len() / 2, Logits::Last),
        (p[2].clone(), p[2].len() - 1, Logits::Last),
        (p[3].clone(), 3, Logits::All),
    ];
    let mut solo = Vec::new();
    for (tokens, cached, mode) in &plans {
        let mut c = start(&tokens[..*cached]);
        solo.push(model.forward(&tokens[*cached..], &mut c, *mode).unwrap());
    }
    let mut caches: Vec<SeqCache> = plans.iter().map(|(t, cached, _)| start(&t[..*cached])).collect();
    let mut rows: Vec<Row<'_>> = plans
        .iter()
        .zip(caches.iter_mut())
        .map(|((t, cached, mode), cache)| Row { tokens: &t[*cached..], cache, logits: *mode })
        .collect();
    let batched = model.forward_batch(&mut rows).unwrap();
    for (i, (b, s)) in batched.iter().zip(&solo).enumerate() {
        assert_eq!(b.len(), s.len(), "{file} row {i}");
        assert!(bits(b) == bits(s), "{file} row {i}: batched logits differ from the solo run");
    }
    for ((t, _, _), c) in plans.iter().zip(&caches) {
        assert_eq!(c.len(), t.len(), "every cache advanced by its own tokens");
    }
}

#[test]
fn smollm2_mixed_batch_rows_equal_their_solo_runs() {
    mixed_rows_equal_their_solo_runs(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_mixed_batch_rows_equal_their_solo_runs() {
    mixed_rows_equal_their_solo_runs(GEMMA, "oracle-gemma3.json");
}

/// make-gguf's tiny `preset` at `kind` (`<generated dir>/<preset>-<kind>.gguf`) and the
/// prompts of its serial fixture; `None` when not generated (unless
/// `CORRAL_REQUIRE_GENERATED=1`).
fn generated(preset: &str, kind: &str) -> Option<(Model, Vec<Vec<u32>>)> {
    generated_with(preset, kind, preset)
}

/// `generated`, with the prompts of `fixture_preset`'s fixture (a preset of the same
/// vocabulary).
fn generated_with(preset: &str, kind: &str, fixture_preset: &str) -> Option<(Model, Vec<Vec<u32>>)> {
    let dir = match std::env::var_os("CORRAL_GENERATED_DIR") {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => models_dir().join("generated"),
    };
    let path = dir.join(format!("{preset}-{kind}.gguf"));
    if !path.is_file() {
        assert!(std::env::var("CORRAL_REQUIRE_GENERATED").as_deref() != Ok("1"), "{} is missing", path.display());
        eprintln!("skipped: {} is missing (scripts/models/make-gguf)", path.display());
        return None;
    }
    let f = fixture(&format!("serial-{fixture_preset}-{kind}.json"));
    let prompts = f["cases"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"])).collect();
    Some((Model::load(&Gguf::open(&path).unwrap()).unwrap(), prompts))
}

#[test]
fn qwen3moe_mixed_batch_rows_equal_their_solo_runs() {
    // The types CI makes before this test runs (its q4_k_m waits for llama-quantize).
    for kind in ["q8_0", "q4_0"] {
        if let Some((model, p)) = generated("qwen3moe", kind) {
            mixed_rows_of(&model, &format!("qwen3moe-{kind}"), &p);
        }
    }
}

#[test]
fn qwen35_hybrids_mixed_batch_rows_equal_their_solo_runs() {
    // Both presets have qwen35's vocabulary: its fixture's prompts serve both.
    for preset in ["qwen35", "qwen35moe"] {
        for kind in ["q8_0", "q4_0"] {
            if let Some((model, p)) = generated_with(preset, kind, "qwen35") {
                mixed_rows_of(&model, &format!("{preset}-{kind}"), &p);
            }
        }
    }
}

#[test]
fn gpt_oss_mixed_batch_rows_equal_their_solo_runs() {
    if let Some((model, p)) = generated("gpt-oss", "q8_0") {
        mixed_rows_of(&model, "gpt-oss-q8_0", &p);
    }
}

/// Four sequences decoded greedily together, one token each per pass, rows leaving
/// when they reach their own length: each gets exactly its serial tokens.
fn batched_greedy_decode_equals_serial(file: &str, fixture_name: &str) {
    let model = load(file);
    let p = prompts(fixture_name);
    let lens = [12usize, 5, 9, 1];
    let serial: Vec<Vec<u32>> = p
        .iter()
        .zip(lens)
        .map(|(prompt, n)| {
            let mut c = model.new_cache();
            let mut logits = model.forward(prompt, &mut c, Logits::Last).unwrap();
            let mut out = Vec::new();
            while out.len() < n {
                let id = argmax(&logits);
                out.push(id);
                logits = model.forward(&[id], &mut c, Logits::Last).unwrap();
            }
            out
        })
        .collect();

    let mut caches: Vec<SeqCache> = p.iter().map(|_| model.new_cache()).collect();
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); p.len()];
    let mut next: Vec<Vec<u32>> = p.clone();
    loop {
        let active: Vec<usize> = (0..p.len()).filter(|&i| outs[i].len() < lens[i]).collect();
        if active.is_empty() {
            break;
        }
        let logits = {
            let mut rows: Vec<Row<'_>> = caches
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| active.contains(i))
                .map(|(i, cache)| Row { tokens: &next[i], cache, logits: Logits::Last })
                .collect();
            model.forward_batch(&mut rows).unwrap()
        };
        for (&i, l) in active.iter().zip(&logits) {
            let id = argmax(l);
            outs[i].push(id);
            next[i] = vec![id];
        }
    }
    assert_eq!(outs, serial, "{file}");
}

#[test]
fn smollm2_batched_greedy_decode_equals_serial() {
    batched_greedy_decode_equals_serial(SMOLLM, "oracle-smollm2.json");
}

#[test]
fn gemma3_batched_greedy_decode_equals_serial() {
    batched_greedy_decode_equals_serial(GEMMA, "oracle-gemma3.json");
}

#[test]
fn empty_rows_get_no_logits_and_bad_rows_change_no_cache() {
    let model = load(SMOLLM);
    let (mut a, mut b) = (model.new_cache(), model.new_cache());
    let mut rows = [
        Row { tokens: &[], cache: &mut a, logits: Logits::Last },
        Row { tokens: &[1, 2, 3], cache: &mut b, logits: Logits::Last },
    ];
    let out = model.forward_batch(&mut rows).unwrap();
    assert_eq!((out[0].len(), out[1].len()), (0, model.config().vocab));
    let before = (a.len(), b.len());
    let mut rows = [
        Row { tokens: &[4], cache: &mut a, logits: Logits::Last },
        Row { tokens: &[u32::MAX], cache: &mut b, logits: Logits::Last },
    ];
    assert!(model.forward_batch(&mut rows).is_err());
    assert_eq!((a.len(), b.len()), before);
}
