//! The stop path and the proxy's blame rules with real engine processes: an engine that
//! is stopped (SIGSTOP: it cannot answer its drain or act on SIGTERM) is SIGKILLed by
//! keep-alive and by eviction within their deadlines; failures on the client's side never
//! make the gateway blame (recycle) a healthy engine; a huge prompt is tokenized off the
//! engine's I/O thread, so `/health` on that engine stays fast meanwhile.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn model_arg(id: &str, file: &str) -> String {
    format!("{id}={}", model_path(file).display())
}

fn gateway(models: &[(&str, &str)], extra: &[&str]) -> Gateway {
    let owned: Vec<String> = models.iter().map(|(id, f)| model_arg(id, f)).collect();
    let mut args: Vec<&str> = vec!["--threads", "1"];
    for m in &owned {
        args.extend(["--model", m.as_str()]);
    }
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

fn chat(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens, "temperature": 0})
}

fn pid_of(gw: &Gateway, model: &str) -> u32 {
    gw.engine_of(model)["pid"].as_u64().unwrap_or_else(|| panic!("{model} has no pid: {}", gw.engine())) as u32
}

fn stop_process(pid: u32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
}

/// Timing flags that make the stop deadline short: drain 1 s (+2 s for the cache), then
/// SIGTERM, then SIGKILL 1 s later: a stuck engine is gone ~4 s after its stop begins.
const QUICK_STOP: [&str; 4] = ["--drain-timeout", "1s", "--stop-timeout", "1s"];

#[test]
fn keep_alive_kills_a_sigstopped_engine_within_its_deadline() {
    let mut extra = vec!["--keep-alive", "1s"];
    extra.extend(QUICK_STOP);
    let gw = gateway(&[("smol", SMOLLM)], &extra);
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", 2)).status, 200);
    let pid = pid_of(&gw, "smol");
    stop_process(pid);
    let t0 = Instant::now();
    // keep-alive at ~1 s, drain bound 3 s, SIGTERM grace 1 s: ~5 s; 30 s is the hang bound.
    assert!(
        wait_until(Duration::from_secs(30), || !alive(pid)),
        "a stopped engine outlived keep-alive: {}",
        gw.engine()
    );
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(3), "killed before its drain deadline ({took:?})");
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("smol")["state"] == "stopped"), "{}", gw.engine());
    assert_eq!(gw.engine_of("smol")["last_exit"]["signal"], 9);
    assert!(sockets_in(&gw.run_dir()).is_empty(), "{:?}", sockets_in(&gw.run_dir()));
    eprintln!("keep-alive: SIGSTOPped engine gone after {took:?}");
    // And the model still serves: a fresh engine.
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", 2)).status, 200);
}

#[test]
fn eviction_kills_a_sigstopped_engine_within_its_deadline() {
    let mut extra = vec!["--model-pool", "1"];
    extra.extend(QUICK_STOP);
    let gw = gateway(&[("smol", SMOLLM), ("gemma", GEMMA)], &extra);
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", 2)).status, 200);
    let pid = pid_of(&gw, "smol");
    stop_process(pid);
    let r = gw.post("/v1/chat/completions", &chat("gemma", 2));
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || !alive(pid)),
        "a stopped engine outlived its eviction: {}",
        gw.engine()
    );
    eprintln!("eviction: SIGSTOPped engine gone {:?} after the new one answered", t0.elapsed());
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("smol")["state"] == "stopped"), "{}", gw.engine());
    assert_eq!(gw.counter("evictions"), 1);
    assert_eq!(gw.engine()["pool"]["resident"], json!(["gemma"]));
}

/// The engine of `model` is the same healthy process it was, and still serves.
fn assert_unblamed(gw: &Gateway, model: &str, pid: u32) {
    assert!(wait_until(Duration::from_secs(10), || gw.engine_of(model)["in_flight"] == 0), "{}", gw.engine());
    let e = gw.engine_of(model);
    assert_eq!((e["state"].as_str(), e["pid"].as_u64()), (Some("ready"), Some(pid as u64)), "{e}");
    assert_eq!(e["restarts"], 0, "{e}");
    assert_eq!(gw.counter("crashes"), 0);
    assert_eq!(gw.post("/v1/chat/completions", &chat(model, 2)).status, 200);
}

#[test]
fn failures_on_the_client_side_never_mark_the_engine_unhealthy() {
    let gw = gateway(&[("smol", SMOLLM)], &[]);
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", 2)).status, 200);
    let pid = pid_of(&gw, "smol");

    // A body shorter than its Content-Length, then the client hangs up.
    let mut s = std::net::TcpStream::connect(&gw.addr).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{{\"model\":").unwrap();
    drop(s);
    assert_unblamed(&gw, "smol", pid);

    // The client leaves while the engine is still generating (before the head of a
    // whole response, and in the middle of a stream).
    for stream in [false, true] {
        let body = json!({"model": "smol", "messages": [{"role": "user", "content": "Tell a long story."}],
                          "max_tokens": 300, "stream": stream, "ignore_eos": true})
        .to_string();
        let mut s = std::net::TcpStream::connect(&gw.addr).unwrap();
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        assert!(wait_until(Duration::from_secs(30), || gw.engine_of("smol")["in_flight"] == 1));
        std::thread::sleep(Duration::from_millis(300));
        drop(s);
        assert_unblamed(&gw, "smol", pid);
    }
    assert_eq!(gw.stats()["gateway"]["proxy_errors"], 0, "a client leaving is not a proxy error");
}

fn engine_socket(gw: &Gateway, model: &str) -> PathBuf {
    PathBuf::from(gw.engine_of(model)["socket"].as_str().unwrap())
}

#[test]
fn an_8_mb_prompt_does_not_hold_up_health_on_its_engine() {
    let gw = gateway(&[("smol", SMOLLM)], &["--max-body-bytes", "9000000"]);
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", 1)).status, 200);
    let socket = engine_socket(&gw, "smol");
    let text: String = "The quick brown fox jumps over the lazy dog 1234. ".repeat(8_000_000 / 50);
    let body = json!({"model": "smol", "prompt": text, "max_tokens": 1}).to_string();
    assert!(body.len() >= 8_000_000 && body.len() < 9_000_000);
    let addr = gw.addr.clone();
    let big = std::thread::spawn(move || {
        let r = crate::common::http::request(
            crate::common::http::tcp(&addr),
            "POST",
            "/v1/completions",
            Some(body.as_bytes()),
            &[],
        );
        (r.status, r.text())
    });
    // Probe the engine directly on its socket while it parses and tokenizes.
    let mut probes = Vec::new();
    while !big.is_finished() {
        let t = Instant::now();
        let r = crate::common::http::request(crate::common::http::unix(&socket), "GET", "/health", None, &[]);
        assert_eq!(r.status, 200);
        probes.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, text) = big.join().unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context_length_exceeded"), "{text}");
    probes.sort();
    let pct = |p: usize| probes[(probes.len() - 1) * p / 100];
    eprintln!(
        "/health during an 8 MB prompt: {} probes, p50 {:?}, p90 {:?}, max {:?}",
        probes.len(),
        pct(50),
        pct(90),
        probes[probes.len() - 1]
    );
    assert!(probes.len() >= 10, "the prompt was handled too fast to measure anything ({} probes)", probes.len());
    assert!(pct(99) <= Duration::from_millis(50), "p99 {:?}", pct(99));
    // The tokenization itself takes seconds: one probe waiting behind it would show.
    assert!(probes[probes.len() - 1] <= Duration::from_millis(500), "max {:?}", probes[probes.len() - 1]);
}
