//! Real model files of issue 33's families against llama.cpp: the optional models of
//! `scripts/models/fetch --extra NAME`, with fixtures from `scripts/models/oracle/real`
//! (llama.cpp's `llama-server -ub 1 -b 2 -fa off --jinja`). For each file: corral's
//! tokenizer gives llama.cpp's ids for every prompt, a chat request's prompt (the file's
//! own template through minijinja, by the server's path) is llama.cpp's for every
//! conversation, tools and a tool call included, and corral's CPU logits with the default
//! numerics, teacher-forced along llama.cpp's serial greedy run, give its tokens and
//! top-2 margins (to float noise for a fixture captured on an AVX-512 host, to the
//! lane-order drift of an AVX2 one: `teacher_forced_agrees_with_llama_cpp_serial`).
//!
//! A missing file skips the test (it prints `skipped:`) unless `CORRAL_REQUIRE_REAL=1`.

mod common;

use common::*;
use corral_engine::Engine;
use corral_engine::model::Logits;
use corral_engine::server::fuzzing::{Api, Model, check};
use serde_json::Value;

/// The engine on the file `scripts/models/fetch --extra NAME` publishes, or `None` (after
/// saying so) when it has not been fetched.
fn load(name: &str) -> Option<(Engine, Value)> {
    let fx = fixture(&format!("real-{name}.json"));
    let path = models_dir().join(fx["model_file"].as_str().unwrap());
    if !path.is_file() {
        let fix = format!("scripts/models/fetch --extra {name}");
        if std::env::var("CORRAL_REQUIRE_REAL").as_deref() == Ok("1") {
            panic!("{} is missing: run {fix}", path.display());
        }
        eprintln!("skipped: {} is missing (run {fix})", path.display());
        return None;
    }
    let engine = Engine::load(&path).unwrap();
    // The oracle's context (`-c 4096`).
    engine.set_context(4096);
    Some((engine, fx))
}

/// Every prompt tokenizes to llama.cpp's ids, and the file's template renders every
/// conversation byte for byte as llama.cpp's `/apply-template` does.
fn prompts_and_chats_equal_llama_cpp(name: &str) {
    let Some((engine, fx)) = load(name) else { return };
    let mut failures = Vec::new();
    assert!(engine.tool_format.native, "{name}: the file's template renders tools itself");
    let chats = fx["chat"].as_array().unwrap();
    assert!(chats.len() >= 5 && chats.iter().any(|c| c.get("tools").is_some()));
    // The server's own path from a chat request to the prompt (parse, validation, the
    // messages in the template's shape, the tool list), which the fuzz targets use too.
    let model = Model { tool_format: engine.tool_format.clone(), template: engine.template.as_ref() };
    for c in chats {
        let cname = c["name"].as_str().unwrap();
        let mut body = serde_json::json!({"model": name, "messages": c["messages"]});
        if let Some(tools) = c.get("tools") {
            body["tools"] = tools.clone();
        }
        let got = check(Api::Chat, body.to_string().as_bytes(), &model).unwrap().unwrap();
        let want = c["rendered"].as_str().unwrap();
        if got != want {
            failures.push(format!("{name} {cname}: rendered\n{got:?}\n  llama.cpp\n{want:?}"));
        }
        if engine.raw_prompt(want).unwrap() != ids(&c["ids"]) {
            failures.push(format!("{name} {cname}: the rendered chat's ids differ from llama.cpp's"));
        }
    }
    for case in fx["cases"].as_array().unwrap() {
        let got = engine.raw_prompt(case["prompt"].as_str().unwrap()).unwrap();
        if got != ids(&case["prompt_ids"]) {
            failures.push(format!("{name} {}: prompt ids {got:?}, llama.cpp's {:?}", case["name"], case["prompt_ids"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Teacher-forced along llama.cpp's serial greedy run (its tokens fed back, so every
/// step stays comparable): at every step corral's top-2 margin is within `drift` of
/// llama.cpp's, and its argmax is llama.cpp's token wherever llama.cpp's margin exceeds
/// `drift`.
///
/// `drift` is not float noise: corral reproduces the AVX-512 build of llama.cpp bit for
/// bit (docs/engine.md, "Numerics"), and a fixture captured on an AVX2-only host
/// (`fixture.cpu`) differs from that build in its f16 dot, softmax and horizontal-sum lane
/// orders, by up to ~0.35 in these margins on SmolLM2 (whose AVX-512 fixture corral matches
/// exactly). A graph error (a bias, a rope base, a scale left out) moves them by more.
/// An AVX-512 capture is held to float noise (`drift`).
fn teacher_forced_agrees_with_llama_cpp_serial(name: &str, drift: f64) {
    let Some((engine, fx)) = load(name) else { return };
    let model = &engine.model;
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    let (mut failures, mut worst, mut steps) = (Vec::new(), 0.0f64, 0);
    for c in cases {
        let cname = c["name"].as_str().unwrap();
        let want = ids(&c["tokens"]);
        // NaN: llama-server gave no probabilities for that token.
        let margins: Vec<f64> =
            c["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap_or(f64::NAN)).collect();
        let mut cache = model.new_cache();
        let mut logits = model.forward(&ids(&c["prompt_ids"]), &mut cache, Logits::Last).unwrap();
        for (i, (&t, &theirs)) in want.iter().zip(&margins).enumerate() {
            let (ours, d) = (margin(&logits), (margin(&logits) - theirs).abs());
            steps += 1;
            worst = if d > worst { d } else { worst };
            if d > drift {
                failures.push(format!("{name} {cname} token {i}: top-2 margin {ours:.4}, llama.cpp's {theirs:.4}"));
            }
            if theirs > drift && argmax(&logits) != t {
                failures.push(format!(
                    "{name} {cname} token {i}: {} where llama.cpp has {t} (margin {theirs:.4})",
                    argmax(&logits)
                ));
            }
            logits = model.forward(&[t], &mut cache, Logits::Last).unwrap();
        }
    }
    eprintln!("{name}: {steps} teacher-forced steps, top-2 margins within {worst:.3} of llama.cpp's");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// Qwen2.5-Coder-0.5B-Instruct (the AWQ checkpoint converted to GGUF Q4_K_M): qwen2 with
// Q/K/V biases, Q5_0 for the 896-wide matrices, Q4_K/Q6_K for `ffn_down`, Q8_0 `output`.

#[test]
fn qwen2_real_prompts_and_chats_equal_llama_cpp() {
    prompts_and_chats_equal_llama_cpp("qwen2");
}

/// The allowed margin difference: float noise for a fixture captured on an AVX-512 host
/// (llama.cpp's f32 log-probabilities), the lane-order drift otherwise.
fn drift(name: &str) -> f64 {
    if fixture(&format!("real-{name}.json"))["cpu"]["avx512"] == true { 1e-3 } else { 1.0 }
}

#[test]
fn qwen2_real_teacher_forced_agrees_with_llama_cpp_serial() {
    teacher_forced_agrees_with_llama_cpp_serial("qwen2", drift("qwen2"));
}
