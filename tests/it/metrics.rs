//! `GET /metrics` on a real `corral serve` with the real models: after real requests the
//! whole answer is read by a strict parser of the Prometheus text format (any malformed
//! line fails it), and the counters moved as the requests say they should.

use crate::common::gateway::*;
use crate::common::*;
use prom_text_format_parser::{Scrape, ValueType};
use serde_json::{Value, json};

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Count from one to ten in words."}],
           "stream": stream, "max_tokens": 12, "temperature": 0})
}

fn scrape(gw: &Gateway) -> Scrape {
    let r = gw.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let text = r.text();
    Scrape::parse(&text).unwrap_or_else(|e| panic!("not the text format: {e:?}\n{text}"))
}

/// The sample of `name` (or its histogram's `_count`) with exactly these labels.
fn get(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (name, kind) = match name.strip_suffix("_count") {
        Some(h) if s.metrics.iter().any(|m| m.name == h) => (h, ValueType::Count),
        _ => (name, ValueType::Sample),
    };
    let m = s.metrics.iter().find(|m| m.name == name)?;
    let matches = |l: &prom_text_format_parser::Labels| {
        l.len() == labels.len() && labels.iter().all(|(k, v)| l.iter().any(|x| x.key == *k && x.value == *v))
    };
    m.samples.iter().find(|x| x.value.value_type == kind && matches(&x.labels)).map(|x| x.value.value.as_f64())
}

#[test]
fn metrics_parse_whole_and_count_requests_engines_ttft_and_switches() {
    let (a, b) = (format!("smol={}", model_path(SMOLLM).display()), format!("gemma={}", model_path(GEMMA).display()));
    let gw = Gateway::start(&["--model", &a, "--model", &b, "--model-pool", "1", "--threads", "1"]);

    let m = scrape(&gw);
    assert_eq!(get(&m, "corral_engines_resident", &[]), Some(0.0));
    assert_eq!(get(&m, "corral_engine_spawns_total", &[]), Some(0.0));
    assert_eq!(get(&m, "corral_ttft_seconds_count", &[("model", "smol")]), None, "no engine, no engine figures");

    let r = gw.post("/v1/chat/completions", &chat("smol", false));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut sse = gw.stream("/v1/chat/completions", &chat("smol", true));
    assert_eq!(sse.status, 200);
    assert_eq!(sse.collect().last().map(String::as_str), Some("[DONE]"));

    let m = scrape(&gw);
    let smol = [("model", "smol")];
    let chat_200 = [("route", "/v1/chat/completions"), ("status", "200")];
    assert_eq!(get(&m, "corral_http_requests_total", &chat_200), Some(2.0));
    let metrics_200 = [("route", "/metrics"), ("status", "200")];
    assert_eq!(get(&m, "corral_http_requests_total", &metrics_200), Some(1.0), "the first scrape, counted once done");
    assert_eq!(get(&m, "corral_engines_resident", &[]), Some(1.0));
    assert_eq!(get(&m, "corral_engine_spawns_total", &[]), Some(1.0));
    assert_eq!(get(&m, "corral_engine_stats_up", &smol), Some(1.0));
    assert_eq!(get(&m, "corral_ttft_seconds_count", &smol), Some(2.0), "one per request");
    assert_eq!(get(&m, "corral_decode_rate_tokens_per_second_count", &smol), Some(2.0));
    assert!(get(&m, "corral_generated_tokens_total", &smol).unwrap() >= 4.0);
    assert_eq!(get(&m, "corral_prompt_cache_hits_total", &smol), Some(1.0), "the same prompt twice");
    assert_eq!(get(&m, "corral_batch_rows", &[("model", "smol"), ("state", "active")]), Some(0.0));
    assert_eq!(get(&m, "corral_queue_depth", &smol), Some(0.0));
    assert!(get(&m, "corral_ssd_cache_bytes", &smol).is_some(), "the tests' SSD tier is on");
    assert!(get(&m, "corral_engine_resident_memory_bytes", &smol).unwrap() > 0.0);

    // A pool of one: gemma's first request evicts smol once gemma is ready.
    let r = gw.post("/v1/chat/completions", &chat("gemma", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(wait_until(std::time::Duration::from_secs(20), || gw.engine_of("smol")["state"] == "stopped"));
    let m = scrape(&gw);
    assert_eq!(get(&m, "corral_engines_resident", &[]), Some(1.0));
    assert_eq!(get(&m, "corral_engine_spawns_total", &[]), Some(2.0));
    assert_eq!(get(&m, "corral_engine_evictions_total", &[]), Some(1.0));
    assert_eq!(get(&m, "corral_model_switch_seconds_count", &[]), Some(1.0));
    assert_eq!(get(&m, "corral_ttft_seconds_count", &[("model", "gemma")]), Some(1.0));
    assert_eq!(get(&m, "corral_ttft_seconds_count", &smol), None, "smol's engine is gone, and its figures with it");
    assert_eq!(get(&m, "corral_http_requests_total", &chat_200), Some(3.0));
}
