//! Limits a real `corral serve` applies before any engine is touched (fake engine): a
//! body over `--max-body-bytes` (declared or chunked) is 413 in the API's shape, too
//! many or too large headers 431, a client that sends its head slowly is cut off, one
//! that stops sending its body gets 408, connections over `--max-connections` wait, and
//! requests over the per-request bounds (`max_tokens` family, `n`, stop strings) are 400
//! without starting an engine.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::http::{self, Response};
use serde_json::{Value, json};

/// Send `head` (request line and headers, each ending in CRLF; the blank line is added)
/// and `body` on a fresh connection, and read the answer.
fn raw(gw: &Gateway, head: &str, body: &[u8]) -> Response {
    http::raw(&gw.addr, &format!("{head}Host: localhost\r\nConnection: close\r\n\r\n"), body)
}

fn chat(extra: Value) -> Value {
    let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    v
}

fn code(r: &Response) -> String {
    let v = r.json();
    v["error"]["code"].as_str().or(v["error"]["type"].as_str()).unwrap_or_default().to_owned()
}

#[test]
fn bodies_over_the_limit_are_413_declared_or_streamed() {
    let gw = fake_gateway(&[("m", json!({}))], &["--max-body-bytes", "4096"]);
    // Declared: refused before a byte of it is read.
    let r = raw(&gw, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 9437184\r\n", b"");
    assert_eq!((r.status, code(&r).as_str()), (413, "payload_too_large"), "{}", r.text());
    let r = raw(&gw, "POST /v1/messages HTTP/1.1\r\nContent-Length: 5000\r\n", &[b' '; 5000]);
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["type"], "request_too_large", "Anthropic's shape: {}", r.text());
    // Chunked: refused once the pieces add up to more.
    let mut chunked = Vec::new();
    for _ in 0..6 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b' '; 1024]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = raw(&gw, "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", &chunked);
    assert_eq!((r.status, code(&r).as_str()), (413, "payload_too_large"), "{}", r.text());
    // Under the limit it goes through (and only then is an engine started).
    assert_eq!(gw.engine_of("m")["state"], "stopped");
    let r = gw.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn too_many_or_too_large_headers_are_431() {
    let gw = fake_gateway(&[("m", json!({}))], &[]);
    let many: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let r = raw(&gw, &format!("GET /health HTTP/1.1\r\n{many}"), b"");
    assert_eq!(r.status, 431);
    let big = format!("Cookie: {}\r\n", "c".repeat(70 * 1024));
    let r = raw(&gw, &format!("GET /health HTTP/1.1\r\n{big}"), b"");
    assert_eq!(r.status, 431);
    // 95 headers of a normal size pass (with the request's own Host and Connection).
    let fine: String = (0..95).map(|i| format!("X-H{i}: v\r\n")).collect();
    assert_eq!(raw(&gw, &format!("GET /health HTTP/1.1\r\n{fine}"), b"").status, 200);
}

/// Read until the server ends the connection; what it sent (it may say 408 first).
fn read_until_closed(s: &mut TcpStream, deadline: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(deadline)).unwrap();
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(out),
        Err(_) => None,
    }
}

#[test]
fn a_client_sending_its_head_slowly_is_cut_off_and_others_are_served_meanwhile() {
    let gw = fake_gateway(&[("m", json!({}))], &["--header-timeout", "1s"]);
    let mut slow = TcpStream::connect(&gw.addr).unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n").unwrap();
    let start = Instant::now();
    let mut cut = false;
    // A header byte every 200 ms, never the blank line.
    while start.elapsed() < Duration::from_secs(20) {
        if slow.write_all(b"X").is_err() {
            cut = true;
            break;
        }
        assert_eq!(gw.get("/health").status, 200, "others are served while it trickles");
        std::thread::sleep(Duration::from_millis(200));
        slow.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        // Anything read (hyper may say 408) or EOF or a reset: the server ended it.
        let ended = match slow.read(&mut b) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        slow.set_nonblocking(false).unwrap();
        if ended {
            cut = true;
            break;
        }
    }
    assert!(cut, "the connection was still open after {:?}", start.elapsed());
    assert!(start.elapsed() < Duration::from_secs(10), "cut after {:?} with a 1 s header timeout", start.elapsed());
}

#[test]
fn a_body_that_stops_arriving_is_408() {
    let gw = fake_gateway(&[("m", json!({}))], &["--body-timeout", "1s"]);
    let mut s = TcpStream::connect(&gw.addr).unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"model\":";
    s.write_all(head.as_bytes()).unwrap();
    let start = Instant::now();
    let got = read_until_closed(&mut s, Duration::from_secs(20)).expect("answered and closed");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    assert_eq!(gw.engine_of("m")["state"], "stopped", "no engine for a request never received");
}

#[test]
fn connections_over_the_cap_wait_for_a_free_one() {
    let gw = fake_gateway(&[("m", json!({}))], &["--max-connections", "2"]);
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&gw.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(&gw.addr).unwrap();
    third.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    third.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
    let mut b = [0u8; 16];
    let early = third.read(&mut b);
    assert!(early.is_err(), "answered while two connections held the cap: {early:?}");
    drop(idle);
    let got = read_until_closed(&mut third, Duration::from_secs(10)).expect("served once one closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
}

#[test]
fn requests_over_the_bounds_are_400_without_an_engine() {
    let gw = fake_gateway(&[("m", json!({}))], &[]);
    let big = (1i64 << 24) + 1;
    let stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let cases = [
        ("/v1/chat/completions", chat(json!({"max_tokens": big})), "max_tokens"),
        ("/v1/chat/completions", chat(json!({"max_completion_tokens": 0})), "max_completion_tokens"),
        ("/v1/chat/completions", chat(json!({"n": 2})), "n"),
        ("/v1/chat/completions", chat(json!({"stop": stops})), "stop"),
        ("/v1/completions", json!({"model": "m", "prompt": "x", "stop": "x".repeat(257)}), "stop"),
        ("/v1/responses", json!({"model": "m", "input": "x", "max_output_tokens": big}), "max_output_tokens"),
    ];
    for (path, body, param) in &cases {
        let r = gw.post(path, body);
        assert_eq!(r.status, 400, "{path} {param}: {}", r.text());
        let v = r.json();
        assert_eq!((v["error"]["code"].as_str(), v["error"]["param"].as_str()), (Some("invalid_value"), Some(*param)));
    }
    let r = gw.post("/v1/messages", &json!({"model": "m", "max_tokens": big, "messages": []}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("max_tokens"), "{}", r.text());
    assert_eq!(gw.engine_of("m")["state"], "stopped", "no engine was started: {}", gw.engine());
    assert_eq!(gw.counter("spawns"), 0);
    // At the bounds, it is the engine's request.
    let ok = chat(json!({"max_tokens": 4, "n": 1, "stop": vec!["a"; 16]}));
    assert_eq!(gw.post("/v1/chat/completions", &ok).status, 200);
}
