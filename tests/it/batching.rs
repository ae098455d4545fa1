//! Continuous batching through `corral serve`, both real models: 2, 4 and 8 concurrent
//! mixed greedy requests (different lengths, stop strings, one JSON schema, one client
//! that leaves mid-stream) are generated together — the engine's counters show passes
//! carrying several rows — and every row's answer equals the same request run alone.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common::chat::{MODELS, real_gateway};
use crate::common::gateway::{Gateway, wait_until};
use serde_json::{Value, json};

fn requests(model: &str) -> Vec<Value> {
    let chat = |content: &str, extra: Value| {
        let mut b = json!({"model": model, "temperature": 0, "messages": [{"role": "user", "content": content}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
                        "required": ["name", "age"], "additionalProperties": false});
    vec![
        chat("Count from 1 to 20, separated by commas.", json!({"max_tokens": 40})),
        chat("Name three colors.", json!({"max_tokens": 12, "stop": ["\n"]})),
        chat(
            "Invent a person.",
            json!({"max_tokens": 60,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}),
        ),
        chat("Write a haiku about the sea.", json!({"max_tokens": 25, "stop": ["sea", "wave"]})),
        chat("What is the capital of France?", json!({"max_tokens": 7})),
        chat("Tell me a short story about a dog.", json!({"max_tokens": 33})),
        chat("List four fruits.", json!({"max_tokens": 18, "stop": [","]})),
        chat("Say hello in French.", json!({"max_tokens": 3})),
    ]
}

fn lane(v: &Value) -> String {
    v["usage"]["lane"].as_str().unwrap().to_owned()
}

/// What must not change when a request shares the batch.
fn answer(v: &Value) -> (String, String, u64) {
    let c = &v["choices"][0];
    (
        c["message"]["content"].as_str().unwrap_or_default().to_owned(),
        c["finish_reason"].as_str().unwrap().to_owned(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

fn batch_of(gw: &Gateway, model: &str) -> Value {
    gw.stats()["engines"][model]["batch"].clone()
}

#[test]
fn concurrent_rows_equal_their_solo_runs_and_a_leaver_frees_its_row() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let reqs = requests(model);
        let solo: Vec<_> = reqs
            .iter()
            .map(|r| {
                let resp = gw.post("/v1/chat/completions", r);
                assert_eq!(resp.status, 200, "{}", resp.text());
                assert_eq!(lane(&resp.json()), "serial");
                answer(&resp.json())
            })
            .collect();
        assert_eq!(batch_of(&gw, model)["peak_rows"], 1, "alone, one row per pass");
        for n in [2, 4, 8] {
            let start = Arc::new(Barrier::new(n + 2));
            let threads: Vec<_> = reqs[..n]
                .iter()
                .cloned()
                .map(|r| {
                    let (addr, start) = (gw.addr.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let resp = crate::common::http::request(
                            crate::common::http::tcp(&addr),
                            "POST",
                            "/v1/chat/completions",
                            Some(r.to_string().as_bytes()),
                            &[],
                        );
                        assert_eq!(resp.status, 200, "{}", resp.text());
                        (answer(&resp.json()), lane(&resp.json()))
                    })
                })
                .collect();
            // One more client streams a long answer and leaves after two events.
            let leaver = {
                let (addr, start) = (gw.addr.clone(), start.clone());
                let body = json!({"model": model, "stream": true, "max_tokens": 400, "temperature": 0,
                                  "messages": [{"role": "user", "content": "Tell me everything about rivers."}]});
                std::thread::spawn(move || {
                    start.wait();
                    let mut sse = crate::common::http::Sse::open(
                        crate::common::http::tcp(&addr),
                        "/v1/chat/completions",
                        body.to_string().as_bytes(),
                        &[],
                    );
                    let _ = (sse.next_event(), sse.next_event());
                })
            };
            start.wait();
            let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            leaver.join().unwrap();
            for (i, ((g, _), s)) in got.iter().zip(&solo).enumerate() {
                assert_eq!(g, s, "{model}, {n} at once: request {i} differs from its solo run");
            }
            let shared = got.iter().filter(|(_, l)| l == "batch").count();
            assert!(shared >= 2, "{model}, {n} at once: usage.lane says batch for {shared}");
            let b = batch_of(&gw, model);
            assert!(b["peak_rows"].as_u64().unwrap() >= 2 && b["batched_steps"].as_u64().unwrap() > 0, "{b}");
            let idle = wait_until(Duration::from_secs(20), || batch_of(&gw, model)["active_rows"] == 0);
            assert!(idle, "the leaver's row was freed: {}", batch_of(&gw, model));
        }
        let s = &gw.stats()["engines"][model];
        assert!(s["requests_cancelled"].as_u64().unwrap() >= 1, "{s}");
        assert_eq!(s["batch"]["configured"], 8);
    }
}

#[test]
fn batch_one_is_strictly_serial() {
    let gw = real_gateway(&["--batch", "1"]);
    let reqs = requests("smol");
    let threads: Vec<_> = reqs[..4]
        .iter()
        .cloned()
        .map(|r| {
            let addr = gw.addr.clone();
            std::thread::spawn(move || {
                let resp = crate::common::http::request(
                    crate::common::http::tcp(&addr),
                    "POST",
                    "/v1/chat/completions",
                    Some(r.to_string().as_bytes()),
                    &[],
                );
                assert_eq!(resp.status, 200);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let b = batch_of(&gw, "smol");
    assert_eq!(
        (b["configured"].as_u64(), b["peak_rows"].as_u64(), b["batched_steps"].as_u64()),
        (Some(1), Some(1), Some(0))
    );
}
