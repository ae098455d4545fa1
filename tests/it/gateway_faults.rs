//! Gateway and pool under engine faults, driven with the fault-injecting fake engine
//! (same protocol as `corral engine`).

use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::*;
use serde_json::{Value, json};

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[test]
fn crash_loop_fails_fast_without_more_spawns() {
    let gw = fake_gateway(&[("loop", json!({"exit_at_start": 1, "stderr": "boom: cannot allocate"}))], &[]);
    let t = Instant::now();
    let r = gw.post("/v1/chat/completions", &chat("loop", false));
    assert_eq!(r.status, 503, "{}", r.text());
    let code = r.json()["error"]["code"].as_str().unwrap().to_owned();
    assert!(code == "engine_start_failed" || code == "engine_crash_loop", "{code}");
    // Keep asking: respawns back off (250 ms, 500 ms, 1 s) until the 4th crash in 60 s.
    let mut last = r;
    while t.elapsed() < Duration::from_secs(20) && last.json()["error"]["code"] != "engine_crash_loop" {
        last = gw.post("/v1/chat/completions", &chat("loop", false));
    }
    assert_eq!(last.json()["error"]["code"], "engine_crash_loop", "{}", last.text());
    assert!(last.json()["error"]["message"].as_str().unwrap().contains("boom: cannot allocate"), "{}", last.text());
    assert_eq!(last.header("retry-after"), Some("60"));
    let spawned = gw.counter("spawns") + gw.counter("respawns");
    assert_eq!(spawned, 4);
    // Failed: answered at once, no new process.
    for _ in 0..5 {
        let t = Instant::now();
        let r = gw.post("/v1/chat/completions", &chat("loop", false));
        assert_eq!(r.status, 503);
        assert!(t.elapsed() < Duration::from_millis(500), "crash-loop answer took {:?}", t.elapsed());
    }
    assert_eq!(gw.counter("spawns") + gw.counter("respawns"), spawned);
    assert_eq!(gw.engine_of("loop")["state"], "failed");
}

#[test]
fn config_error_exit_78_is_not_retried() {
    let gw = fake_gateway(
        &[
            ("bad", json!({"exit_at_start": 78, "stderr": "corral engine: error: bad.gguf is not a GGUF file"})),
            ("good", json!({})),
        ],
        &[],
    );
    for _ in 0..3 {
        let r = gw.post("/v1/chat/completions", &chat("bad", false));
        assert_eq!(r.status, 503);
        assert_eq!(r.json()["error"]["code"], "engine_config");
        assert!(r.text().contains("is not a GGUF file"), "{}", r.text());
    }
    assert_eq!(gw.counter("spawns") + gw.counter("respawns"), 1);
    // Other models keep serving.
    assert_eq!(gw.post("/v1/chat/completions", &chat("good", false)).status, 200);
}

#[test]
fn exit_during_load_reports_the_last_stderr_line_then_respawns() {
    let dir = TempDir::new("flaky");
    let model = fake_model(dir.path(), "flaky", json!({"exit_at_start": 3, "stderr": "bad weights at tensor 7"}));
    let gw = Gateway::start_in(dir, &["--engine-bin", fake_engine_bin(), "--model", model.to_str().unwrap()]);
    let r = gw.post("/v1/chat/completions", &chat("flaky", false));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "engine_start_failed");
    assert!(r.text().contains("bad weights at tensor 7"), "{}", r.text());
    let e = gw.engine_of("flaky");
    assert_eq!(e["state"], "crashed");
    assert_eq!(e["last_exit"]["code"], 3);
    // Fix the "model"; after the backoff the next request respawns it.
    std::fs::write(&model, "{}").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let r = gw.post("/v1/chat/completions", &chat("flaky", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.engine_of("flaky")["restarts"], 1);
}

#[test]
fn crash_mid_stream_is_a_terminal_error_event_and_the_next_request_respawns() {
    let gw = fake_gateway(&[("m", json!({"tokens": 50, "token_ms": 10, "crash_after_tokens": 5}))], &[]);
    let mut s = gw.stream("/v1/chat/completions", &chat("m", true));
    assert_eq!(s.status, 200);
    let events = s.collect();
    assert!(!s.body.complete, "the chunked body must be cut, not terminated");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "engine_unavailable");
    assert!(events.iter().all(|e| e != "[DONE]"));
    assert_eq!(events.len(), 6, "5 tokens then the error: {events:?}");
    // Non-stream request to a model that crashes while answering: 502.
    let r = gw.post("/v1/chat/completions", &chat("m", false));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "engine_unavailable");
    assert!(gw.counter("respawns") >= 1);
}

#[test]
fn hung_engine_times_out_and_is_recycled() {
    let gw = fake_gateway(
        &[
            ("hang", json!({"hang_before_headers": true})),
            ("stall", json!({"tokens": 50, "token_ms": 5, "hang_after_tokens": 3})),
        ],
        &["--engine-timeout", "1s", "--stall-timeout", "700ms", "--model-pool", "2"],
    );
    let t = Instant::now();
    let r = gw.post("/v1/chat/completions", &chat("hang", false));
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "engine_timeout");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(
        wait_until(Duration::from_secs(5), || gw.engine_of("hang")["state"] == "crashed"),
        "not recycled: {}",
        gw.engine_of("hang")
    );
    let mut s = gw.stream("/v1/chat/completions", &chat("stall", true));
    let events = s.collect();
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "engine_timeout", "{events:?}");
    assert!(!s.body.complete);
}

#[test]
fn garbage_from_an_engine_is_a_502() {
    let gw = fake_gateway(&[("junk", json!({"garbage": true}))], &[]);
    let r = gw.post("/v1/chat/completions", &chat("junk", false));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "engine_unavailable");
    assert_eq!(gw.get("/health").status, 200);
}

#[test]
fn only_connections_that_never_reached_the_engine_are_retried() {
    // The engine exits right after becoming ready: the first connect fails, the
    // gateway waits for the respawn and the request succeeds.
    let dir = TempDir::new("retry");
    let model = fake_model(dir.path(), "gone", json!({"exit_after_ready_ms": 150}));
    let gw = Gateway::start_in(
        dir,
        &["--engine-bin", fake_engine_bin(), "--model", model.to_str().unwrap(), "--preload", "gone"],
    );
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("gone")["last_exit"]["code"] == 1));
    std::fs::write(&model, "{}").unwrap();
    let r = gw.post("/v1/chat/completions", &chat("gone", false));
    assert_eq!(r.status, 200, "{}", r.text());
    // An engine that dies after receiving the request: 502, never replayed.
    let gw = fake_gateway(&[("die", json!({"die_on_request": true}))], &[]);
    let r = gw.post("/v1/chat/completions", &chat("die", false));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(gw.counter("spawns") + gw.counter("respawns"), 1, "a sent request must not be retried on a new engine");
}

#[test]
fn busy_engines_are_never_evicted() {
    let gw = fake_gateway(
        &[("a", json!({"tokens": 200, "token_ms": 20})), ("b", json!({}))],
        &["--model-pool", "1", "--queue-timeout", "1s", "--load-timeout", "1s"],
    );
    let mut a = gw.stream("/v1/chat/completions", &chat("a", true));
    assert!(a.next_event().is_some());
    let t = Instant::now();
    let r = gw.post("/v1/chat/completions", &chat("b", false));
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "overloaded");
    assert!(r.header("retry-after").is_some());
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert_eq!(gw.engine_of("b")["state"], "stopped", "b must not start while a is busy at cap 1");
    let rest = a.collect();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "a's stream was cut");
    // Now a is idle: b starts, a is evicted once b is ready.
    assert_eq!(gw.post("/v1/chat/completions", &chat("b", false)).status, 200);
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("a")["state"] == "stopped"));
    assert_eq!(gw.counter("evictions"), 1);
}

#[test]
fn concurrent_cold_requests_start_exactly_one_engine() {
    let gw = fake_gateway(&[("cold", json!({"load_ms": 500, "tokens": 3}))], &[]);
    let addr = gw.addr.clone();
    let handles: Vec<_> = (0..100)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = chat("cold", false).to_string();
                crate::common::http::request(
                    crate::common::http::tcp(&addr),
                    "POST",
                    "/v1/chat/completions",
                    Some(body.as_bytes()),
                    &[],
                )
                .status
            })
        })
        .collect();
    let statuses: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(gw.counter("spawns"), 1);
    assert_eq!(gw.counter("respawns"), 0);
}

#[test]
fn routing_errors_and_closed_admin_routes() {
    let gw = fake_gateway(&[("a", json!({})), ("b", json!({}))], &[]);
    let r = gw.post("/v1/chat/completions", &chat("nope", false));
    assert_eq!(r.status, 404);
    let v = r.json();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains("a, b"), "{v}");
    let r = gw.post("/v1/chat/completions", &json!({"messages": []}));
    assert_eq!(r.status, 404, "no model with two configured");
    for path in ["/admin/drain", "/admin/stats", "/admin/cache/flush"] {
        assert_eq!(gw.post(path, &json!({})).status, 404, "{path}");
        assert_eq!(gw.get(path).status, 404, "{path}");
    }
    assert_eq!(gw.get("/v1/chat/completions").status, 405);
    assert_eq!(gw.get("/nothing").status, 404);
    assert_eq!(gw.counter("spawns"), 0, "nothing above may start an engine");
    // With one model, a missing or unknown model goes to it.
    let one = fake_gateway(&[("only", json!({}))], &[]);
    assert_eq!(one.post("/v1/chat/completions", &json!({"messages": []})).status, 200);
    assert_eq!(one.post("/v1/chat/completions", &chat("gpt-4", false)).status, 200);
    assert_eq!(one.engine()["pool"]["default"], "only");
}

#[test]
fn monitoring_never_wakes_an_engine_and_marks_slow_engines_stale() {
    let gw = fake_gateway(&[("a", json!({})), ("b", json!({}))], &["--model-pool", "2"]);
    for path in ["/engine", "/stats", "/v1/models", "/health"] {
        assert_eq!(gw.get(path).status, 200, "{path}");
    }
    assert_eq!(gw.counter("spawns"), 0);
    let models = gw.get("/v1/models").json();
    assert_eq!(models["data"].as_array().unwrap().len(), 2);
    assert!(models["data"].as_array().unwrap().iter().all(|m| m["resident"] == false));
    assert_eq!(gw.post("/v1/chat/completions", &chat("a", false)).status, 200);
    let e = gw.engine();
    assert_eq!(e["pool"]["cap"], 2);
    assert_eq!(e["pool"]["resident"], json!(["a"]));
    let a = gw.engine_of("a");
    assert_eq!(a["state"], "ready");
    assert!(a["pid"].as_u64().is_some() && a["socket"].as_str().is_some() && a["started_at"].as_u64().is_some());
    assert_eq!(a["in_flight"], 0);
    let s = gw.stats();
    assert_eq!(s["engines"]["a"]["model"], "a");
    assert_eq!(s["engines"]["a"]["pid"], a["pid"]);
    assert_eq!(s["gateway"]["requests_by_route"]["/v1/chat/completions"], 1);
    assert!(s["gateway"]["responses_by_status"]["200"].as_u64().unwrap() >= 1);
    // A stopped (SIGSTOPped) engine does not hold /stats up.
    let pid = a["pid"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    let s = gw.stats();
    assert!(t.elapsed() < Duration::from_secs(3), "stats blocked for {:?}", t.elapsed());
    assert_eq!(s["engines"]["a"]["stale"], true, "{s}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT).unwrap();
}
