//! Memory admission through `corral serve`: with a small `--kv-budget`, a prompt whose KV
//! can never fit is a 400 `context_over_budget` in each API's shape, `max_tokens` beyond
//! the budget is capped and said in a `Warning` header, and a burst that does not fit
//! together queues and completes with the same answers as alone. Also `corral fit`.

use std::sync::{Arc, Barrier};

use crate::common::chat::real_gateway;
use crate::common::{SMOLLM, model_path, run_corral};
use serde_json::{Value, json};

/// 5 MB of KV: 6 blocks of 32 positions for SmolLM2 (23,040 bytes a token), 8 for Gemma 3.
const KV: &str = "0.005";

fn chat(model: &str, content: &str, max_tokens: u64) -> Value {
    json!({"model": model, "temperature": 0, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]})
}

#[test]
fn over_budget_prompts_are_refused_and_long_answers_capped() {
    let gw = real_gateway(&["--kv-budget", KV, "--context-length", "2048"]);
    let long = "word ".repeat(400);
    for model in ["smol", "gemma"] {
        let r = gw.post("/v1/chat/completions", &chat(model, &long, 10));
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["code"], "context_over_budget", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("5000000 bytes"), "{e}");
        let a = gw.post(
            "/v1/messages",
            &json!({"model": model, "max_tokens": 10,
            "messages": [{"role": "user", "content": long}]}),
        );
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["type"], "invalid_request_error", "Anthropic's shape");
        assert_eq!(a.json()["type"], "error");

        let r = gw.post("/v1/chat/completions", &chat(model, "Tell me a long story.", 1000));
        assert_eq!(r.status, 200, "{}", r.text());
        let warning = r.header("warning").unwrap_or_default().to_owned();
        assert!(warning.contains("max_tokens capped to"), "{warning}");
        let capped: u64 = warning.split("capped to ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(capped), "{v}");
        let s = &gw.stats()["engines"][model];
        assert_eq!((s["ctx"].as_u64(), s["batch"]["kv_budget_bytes"].as_u64()), (Some(2048), Some(5_000_000)), "{s}");
        assert!(s["memory"]["budget_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn a_burst_over_the_kv_budget_queues_and_completes() {
    let gw = real_gateway(&["--kv-budget", KV]);
    for model in ["smol", "gemma"] {
        // Each reserves 5 or 6 blocks (a short prompt + 130 tokens): two never fit together.
        let reqs: Vec<Value> = (0..4).map(|i| chat(model, &format!("Count to {}.", i + 3), 130)).collect();
        let solo: Vec<Value> =
            reqs.iter().map(|r| gw.post("/v1/chat/completions", r).json()["choices"].clone()).collect();
        let start = Arc::new(Barrier::new(reqs.len()));
        let threads: Vec<_> = reqs
            .into_iter()
            .map(|r| {
                let (addr, start) = (gw.addr.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let body = r.to_string();
                    let resp = crate::common::http::request(
                        crate::common::http::tcp(&addr),
                        "POST",
                        "/v1/chat/completions",
                        Some(body.as_bytes()),
                        &[],
                    );
                    assert_eq!(resp.status, 200, "{}", resp.text());
                    resp.json()["choices"].clone()
                })
            })
            .collect();
        let got: Vec<Value> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(got, solo, "{model}");
        let b = &gw.stats()["engines"][model]["batch"];
        assert_eq!(b["peak_rows"], 1, "the budget holds one such row at a time: {b}");
        assert_eq!(b["kv_bytes"], 0, "{b}");
    }
}

#[test]
fn fit_reports_weights_kv_per_token_and_the_context_that_fits() {
    let model = model_path(SMOLLM);
    let out = run_corral(
        &["fit", model.to_str().unwrap(), "--json", "--memory-budget", "1", "--threads", "1"],
        std::time::Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let size = std::fs::metadata(&model).unwrap().len();
    assert_eq!(v["weight_bytes"], size);
    assert_eq!(v["kv_bytes_per_token"], 30 * 2 * 192 * 2, "30 layers, 3 KV heads of 64, f16");
    assert_eq!(v["max_context_in_budget"], (1_000_000_000 - size) / (23_040 * 32) * 32, "whole 32-token blocks");
    assert_eq!(v["recurrent_state_bytes"], 0);
    assert!(v["read_bandwidth_bytes_s"].as_f64().unwrap() > 1e8 && v["decode_tok_s_bound"].as_f64().unwrap() > 1.0);
}

/// A hybrid model (make-gguf's tiny qwen35: one attention layer, three Gated DeltaNet
/// layers): KV for the attention layer only, and the recurrent state per sequence.
#[test]
fn fit_counts_a_hybrid_models_recurrent_state() {
    let Some(model) = crate::common::generated::generated_model("qwen35", "q8_0") else { return };
    let out = run_corral(
        &["fit", model.to_str().unwrap(), "--json", "--memory-budget", "0.2", "--threads", "1"],
        std::time::Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kv_bytes_per_token"], 2 * 256 * 2, "1 attention layer, 2 KV heads of 128, f16");
    assert_eq!(v["recurrent_state_bytes"], 3 * (3 * 512 + 4 * 64 * 64) * 4, "3 layers of conv and delta state");
    // 0.2 GB less the weights: the KV of n tokens and 1 + n/2048 + 1 states.
    let room = 200_000_000 - std::fs::metadata(&model).unwrap().len();
    let n = v["max_context_in_budget"].as_u64().unwrap();
    let need = |n: u64| n * 1024 + (2 + n / 2048) * 215_040;
    assert!(need(n) <= room && need(n + 32) > room, "{n} tokens in {room} bytes");
}
