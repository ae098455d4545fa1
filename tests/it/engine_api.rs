//! The real `corral engine` on SmolLM2 over its unix socket: the OpenAI surface,
//! usage accounting, sampling controls, and every bad input (each followed by a good
//! request on the same engine).

use std::sync::OnceLock;

use crate::common::engine::EngineProc;
use crate::common::*;
use corral_engine::Engine;
use serde_json::{Value, json};

fn engine() -> &'static EngineProc {
    static E: OnceLock<EngineProc> = OnceLock::new();
    E.get_or_init(|| EngineProc::start(&model_path(SMOLLM), &["--max-body-bytes", "200000"]))
}

fn local() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| Engine::load(&model_path(SMOLLM)).unwrap())
}

fn oracle(case: &str, n: usize) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/tests/fixtures/oracle-smollm2.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let g = fx["greedy"].as_array().unwrap().iter().find(|g| g["name"] == case).unwrap();
    // The engine computes every row the way llama.cpp computes a one-token batch (batch-invariant
    // numerics, docs/engine.md), so its greedy output is llama.cpp's serial greedy output.
    let ids: Vec<u32> =
        g["serial_tokens"].as_array().unwrap()[..n].iter().map(|v| v.as_u64().unwrap() as u32).collect();
    local().tokenizer.decode(&ids)
}

const HAIKU: &str = "Write a haiku about the sea.";

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": HAIKU}], "temperature": 0, "max_tokens": 16});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn assert_good_request_works() {
    let r = engine().post("/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn chat_non_stream_matches_llama_cpp_and_counts_usage() {
    // Its own engine: the shared one may have cached this prompt for another test.
    let e = EngineProc::start(&model_path(SMOLLM), &[]);
    let r = e.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], oracle("haiku", 16));
    assert_eq!(choice["finish_reason"], "length");
    let prompt = local().chat_prompt(&[corral_engine::chat::ChatMessage::new("user", HAIKU)]).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + 16);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[test]
fn chat_stream_is_the_same_text_as_chunks() {
    let mut s = engine()
        .stream("/v1/chat/completions", &chat(json!({"stream": true, "stream_options": {"include_usage": true}})));
    assert_eq!(s.status, 200);
    assert_eq!(s.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-type")).unwrap().1, "text/event-stream");
    let events = s.collect();
    assert!(s.body.complete, "stream ended cleanly");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, oracle("haiku", 16));
    let finish = chunks.iter().find(|c| c["choices"][0]["finish_reason"].is_string()).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 16);
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    // Content arrives as many events (one per token), not one buffered blob.
    assert!(chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].is_string()).count() >= 10);
}

#[test]
fn completions_text_and_token_prompts() {
    let ids = local().raw_prompt("The capital of France is").unwrap();
    let a = engine()
        .post("/v1/completions", &json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}));
    assert_eq!(a.status, 200, "{}", a.text());
    let b = engine().post("/v1/completions", &json!({"prompt": ids, "temperature": 0, "max_tokens": 8}));
    assert_eq!(b.status, 200, "{}", b.text());
    let (a, b) = (a.json(), b.json());
    assert_eq!(a["object"], "text_completion");
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert!(!a["choices"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(a["usage"]["prompt_tokens"], ids.len());
    let mut s = engine().stream(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8, "stream": true}),
    );
    let events = s.collect();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(text, a["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn stop_strings_end_generation_without_emitting_the_stop() {
    let full = oracle("haiku", 16);
    // Stop on a word from the middle of the greedy continuation.
    let word = full.split_whitespace().nth(3).unwrap().to_owned();
    let r = engine().post("/v1/chat/completions", &chat(json!({"stop": [word.clone(), "never-appears"]}))).json();
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(text, &full[..full.find(&word).unwrap()]);
    assert!(!text.contains(&word));
    let mut s = engine().stream("/v1/chat/completions", &chat(json!({"stop": word.clone(), "stream": true})));
    let streamed: String = s
        .collect()
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"]["content"].as_str().map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, text);
}

#[test]
fn seeds_reproduce_and_differ() {
    let body = |seed: u64| json!({"prompt": "Once upon a time", "temperature": 1.2, "max_tokens": 24, "seed": seed});
    let t =
        |seed| engine().post("/v1/completions", &body(seed)).json()["choices"][0]["text"].as_str().unwrap().to_owned();
    let (a, b, c) = (t(7), t(7), t(8));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn logprobs_are_reported() {
    let r = engine()
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 3, "logprobs": true, "top_logprobs": 2})))
        .json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp);
        assert_eq!(top[0]["token"], t["token"]);
    }
}

#[test]
fn models_health_and_stats() {
    let m = engine().get("/v1/models").json();
    let card = &m["data"][0];
    assert_eq!(card["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "corral");
    assert_eq!(card["context_window"], 4096);
    assert_eq!(card["capabilities"]["chat_completions"], true);
    assert_eq!(card["gen_defaults"]["temperature"].as_f64().unwrap() as f32, 0.8);
    assert_eq!(engine().get("/health").json(), json!({"status": "ok"}));
    let s = engine().stats();
    assert_eq!(s["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(s["memory"]["rss_bytes"].as_u64().unwrap() > 50_000_000);
    assert_eq!(s["max_queue"], 64);
}

fn expect_error(method: &str, path: &str, body: Option<&[u8]>, status: u16, code: &str) {
    let r = crate::common::http::request(engine().conn(), method, path, body, &[]);
    assert_eq!(r.status, status, "{method} {path} {:?}: {}", body.map(String::from_utf8_lossy), r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{}", r.text());
    let ty = match status {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    assert_eq!(v["error"]["type"], ty);
    assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    assert_good_request_works();
}

#[test]
fn bad_inputs_get_clear_4xx_and_the_engine_keeps_serving() {
    let post =
        |body: &str, status, code| expect_error("POST", "/v1/chat/completions", Some(body.as_bytes()), status, code);
    post("{not json", 400, "invalid_json");
    post(r#"{"messages": [{"role": "user", "content": "hi"}]} trailing"#, 400, "invalid_json");
    // Deep nesting: rejected at the first bracket (a list is not a request object).
    post(&format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)), 400, "invalid_value");
    post(
        &format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "stop": {}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        ),
        400,
        "invalid_json",
    );
    post(r#"{"temperature": 0}"#, 400, "invalid_value");
    post(r#"{"messages": []}"#, 400, "invalid_value");
    post(r#"{"messages": "hello"}"#, 400, "invalid_value");
    post(r#"{"messages": [{"role": "user", "content": 5}]}"#, 400, "invalid_value");
    post(r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#, 400, "invalid_value");
    post(r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#, 400, "invalid_value");
    let m = r#""messages": [{"role": "user", "content": "hi"}]"#;
    for bad in [
        r#""temperature": -0.5"#,
        r#""temperature": "hot""#,
        r#""top_p": 0"#,
        r#""top_p": 1.5"#,
        r#""max_tokens": 0"#,
        r#""max_tokens": -3"#,
        r#""max_tokens": 9223372036854775807"#,
        r#""logprobs": true, "top_logprobs": 21"#,
        r#""n": 2"#,
        r#""logit_bias": {"abc": 1}"#,
        r#""logit_bias": {"99999999": 1}"#,
        r#""presence_penalty": 9"#,
    ] {
        post(&format!("{{{m}, {bad}}}"), 400, "invalid_value");
    }
    // Stop strings: at most 16, each at most 256 bytes (`protocol::bounds`).
    post(&format!(r#"{{{m}, "stop": "{}"}}"#, "x".repeat(257)), 400, "invalid_value");
    let stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    post(&format!(r#"{{{m}, "stop": {}}}"#, serde_json::to_string(&stops).unwrap()), 400, "invalid_value");
    // Invalid UTF-8 and a lone surrogate escape.
    expect_error(
        "POST",
        "/v1/chat/completions",
        Some(b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"),
        400,
        "invalid_json",
    );
    post(r#"{"messages": [{"role": "user", "content": "\udc80"}]}"#, 400, "invalid_json");
    // Completions-specific.
    expect_error("POST", "/v1/completions", Some(br#"{"max_tokens": 3}"#), 400, "invalid_value");
    expect_error("POST", "/v1/completions", Some(br#"{"prompt": [1, 2, 999999999]}"#), 400, "invalid_value");
    expect_error("POST", "/v1/completions", Some(br#"{"prompt": ["a", "b"]}"#), 400, "invalid_value");
    // Over the body limit (this engine: 200 kB).
    let big = format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "a".repeat(300_000));
    expect_error("POST", "/v1/chat/completions", Some(big.as_bytes()), 413, "payload_too_large");
    // Routes and methods.
    expect_error("GET", "/v1/nothing", None, 404, "not_found");
    expect_error("GET", "/v1/chat/completions", None, 405, "method_not_allowed");
    expect_error("POST", "/health", Some(b"{}"), 405, "method_not_allowed");
}

#[test]
fn context_limits() {
    let e = EngineProc::start(&model_path(SMOLLM), &["--ctx", "64"]);
    let long = "word ".repeat(100);
    let r = e.post("/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // A max_tokens beyond the remaining context is capped and reported as length.
    let r = e.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 1000, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"], 64);
    assert_eq!(e.get("/v1/models").json()["data"][0]["context_window"], 64);
}

#[test]
fn omitted_max_tokens_means_512_for_raw_completions_and_the_context_for_chat() {
    let r =
        engine().post("/v1/completions", &json!({"prompt": "Once upon a time", "temperature": 0, "ignore_eos": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["usage"]["completion_tokens"].as_u64(), v["choices"][0]["finish_reason"].as_str()),
        (Some(512), Some("length"))
    );
    // top_logprobs: -1 is "unset", as some clients send it.
    let r = engine().post("/v1/chat/completions", &chat(json!({"top_logprobs": -1})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["choices"][0]["logprobs"].is_null());
}
