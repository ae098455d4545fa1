//! `corral engine` as a process: cancellation on disconnect, back-pressure, drain,
//! signals, parent death, socket safety and startup failures.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use crate::common::engine::EngineProc;
use crate::common::*;
use nix::sys::signal::Signal;
use serde_json::json;

fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn long_stream(max_tokens: usize) -> serde_json::Value {
    json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": true, "stream": true, "temperature": 0})
}

#[test]
fn disconnect_mid_stream_stops_generation() {
    let e = EngineProc::start(&model_path(SMOLLM), &[]);
    let mut s = e.stream("/v1/completions", &long_stream(5000));
    for _ in 0..3 {
        assert!(s.next_event().is_some());
    }
    drop(s);
    assert!(wait_until(Duration::from_secs(10), || e.stats()["in_flight"] == 0), "generation did not stop");
    let a = e.stats()["generated_tokens_total"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let st = e.stats();
    assert_eq!(st["generated_tokens_total"].as_u64().unwrap(), a, "still generating after cancel");
    assert!(a < 1000, "generated {a} tokens for a client that left after 3");
    assert_eq!(st["requests_cancelled"], 1);
}

#[test]
fn disconnect_during_prefill_stops_between_chunks() {
    let e = EngineProc::start(&model_path(SMOLLM), &[]);
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(200); // ~2,000 tokens
    let body = json!({"prompt": prompt, "max_tokens": 50, "stream": true});
    let s = e.stream("/v1/completions", &body);
    assert!(wait_until(Duration::from_secs(10), || e.stats()["in_flight"] == 1));
    drop(s);
    assert!(wait_until(Duration::from_secs(30), || e.stats()["in_flight"] == 0), "prefill was not cut");
    let st = e.stats();
    assert_eq!(st["generated_tokens_total"], 0);
    assert_eq!(st["requests_cancelled"], 1);
}

#[test]
fn disconnect_of_a_non_streaming_request_stops_generation() {
    let e = EngineProc::start(&model_path(SMOLLM), &[]);
    let mut conn = e.conn();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 5000, "ignore_eos": true}).to_string();
    crate::common::http::send(conn.as_mut(), "POST", "/v1/completions", Some(body.as_bytes()), &[]);
    assert!(wait_until(Duration::from_secs(10), || e.stats()["generated_tokens_total"].as_u64().unwrap() > 5));
    drop(conn);
    assert!(wait_until(Duration::from_secs(10), || e.stats()["in_flight"] == 0), "generation did not stop");
    assert!(e.stats()["generated_tokens_total"].as_u64().unwrap() < 5000);
}

#[test]
fn full_queue_is_429_and_drain_is_503() {
    // One row at a time: with batching (8 rows by default) a queued request joins the
    // running one at the next step, and the queue is full only for that moment.
    let e = EngineProc::start(&model_path(SMOLLM), &["--max-queue", "1", "--batch", "1"]);
    // Long enough to still be running when a loaded machine gets to the check; the
    // drain below cuts it.
    let mut running = e.stream("/v1/completions", &long_stream(5000));
    assert!(running.next_event().is_some());
    let mut queued = e.stream("/v1/completions", &long_stream(4));
    assert!(wait_until(Duration::from_secs(30), || e.stats()["queue_depth"] == 1));
    let r = e.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "queue_full");
    assert_eq!(r.header("retry-after"), Some("1"));
    // Drain with a short deadline: the queued request runs or is cut, the running one is cut.
    let d = e.post("/admin/drain?timeout_ms=300", &json!({})).json();
    assert_eq!(d["drained"], true);
    assert_eq!(d["demotions"], 0);
    let r = e.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}));
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "engine_draining");
    assert_eq!(e.stats()["draining"], true);
    // Both streams end (cut: no [DONE]) rather than hang.
    let rest = running.collect();
    assert_ne!(rest.last().map(String::as_str), Some("[DONE]"));
    let _ = queued.collect();
    assert!(wait_until(Duration::from_secs(5), || e.stats()["in_flight"] == 0));
}

#[test]
fn sigterm_when_idle_exits_zero_and_removes_the_socket() {
    let mut e = EngineProc::start(&model_path(SMOLLM), &[]);
    assert!(e.socket.exists());
    e.signal(Signal::SIGTERM);
    let status = e.wait_exit(Duration::from_secs(10)).expect("exited");
    assert_eq!(status.code(), Some(0));
    assert!(!e.socket.exists(), "socket file left behind");
}

#[test]
fn sigterm_lets_the_running_stream_finish() {
    // A wide drain deadline: with the other tests' engines on the same cores, 40 tokens
    // can take longer than the default 10 s, and then the drain rightly cuts the stream.
    let mut e = EngineProc::start(&model_path(SMOLLM), &["--shutdown-timeout-ms", "120000"]);
    let mut s = e.stream("/v1/completions", &long_stream(40));
    assert!(s.next_event().is_some());
    e.signal(Signal::SIGTERM);
    let rest = s.collect();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "in-flight stream was cut");
    assert_eq!(e.wait_exit(Duration::from_secs(30)).expect("exited").code(), Some(0));
}

#[test]
fn stdin_eof_means_the_parent_is_gone() {
    let mut e = EngineProc::start(&model_path(SMOLLM), &[]);
    let mut s = e.stream("/v1/completions", &long_stream(5000));
    assert!(s.next_event().is_some());
    drop(e.stdin.take());
    let status = e.wait_exit(Duration::from_secs(5)).expect("engine outlived its parent");
    assert_eq!(status.code(), Some(0));
    assert!(!e.socket.exists());
}

#[test]
fn socket_and_directory_are_private() {
    let e = EngineProc::start(&model_path(SMOLLM), &[]);
    let sock = std::fs::metadata(&e.socket).unwrap();
    assert_eq!(sock.mode() & 0o777, 0o600);
    let dir = std::fs::metadata(e.socket.parent().unwrap()).unwrap();
    assert_eq!(dir.mode() & 0o777, 0o700);
    assert_eq!(e.ready["event"], "ready");
    assert_eq!(e.ready["pid"], e.child.id());
    assert_eq!(e.ready["socket"], e.socket.display().to_string());
    assert_eq!(e.ready["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(e.ready["load_ms"].as_u64().is_some());
}

#[test]
fn stale_socket_is_replaced_but_a_live_one_is_not() {
    let dir = TempDir::new("stale");
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = run.join("e.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap()); // leaves a dead socket file
    let e = EngineProc::start_at(&model_path(SMOLLM), &sock, &[], dir).expect("stale socket replaced");
    assert_eq!(e.get("/health").status, 200);
    // A second engine on the same live socket refuses (config error, 78).
    let err = EngineProc::start_at(&model_path(SMOLLM), &sock, &[], TempDir::new("unused")).err().expect("refused");
    assert_eq!(err.0.and_then(|s| s.code()), Some(78));
    assert!(err.1.contains("in use"), "{}", err.1);
    assert_eq!(e.get("/health").status, 200, "the first engine is unharmed");
}

#[test]
fn unsafe_socket_directory_is_refused() {
    let dir = TempDir::new("opendir");
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = EngineProc::start_at(&model_path(SMOLLM), &open.join("e.sock"), &[], dir).err().expect("refused");
    assert_eq!(err.0.and_then(|s| s.code()), Some(78));
    assert!(err.1.contains("mode 755"), "{}", err.1);
}

#[test]
fn unloadable_model_exits_78_with_one_line() {
    let dir = TempDir::new("badmodel");
    let bad = dir.path().join("bad.gguf");
    std::fs::File::create(&bad).unwrap().write_all(b"not a model").unwrap();
    let sock = dir.path().join("run/e.sock");
    let err = EngineProc::start_at(&bad, &sock, &[], TempDir::new("unused")).err().expect("refused");
    assert_eq!(err.0.and_then(|s| s.code()), Some(78));
    let plain: Vec<&str> = err.1.lines().filter(|l| l.starts_with("corral engine: error:")).collect();
    assert_eq!(plain.len(), 1, "{}", err.1);
    assert!(plain[0].contains("not a GGUF file"), "{}", err.1);
    assert!(!err.1.contains("panicked"));
}
