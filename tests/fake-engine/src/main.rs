//! A fault-injecting stand-in for `corral engine`, for gateway tests only.
//!
//! It speaks the engine's protocol (argv, ready line, socket, `/health`, `/v1/models`,
//! `/admin/*`, streamed and whole completions) without a model, with the flag names, event
//! line and stats shapes of `corral_protocol`: its "model file" is a
//! JSON object of behaviours, e.g. `{"tokens": 40, "token_ms": 20, "crash_after_tokens":
//! 5}`. Every field is optional:
//!
//! - `exit_at_start`: exit with this code before loading (crash loop, 78 = config error)
//! - `stderr`: a line to print on stderr first
//! - `load_ms`: pretend loading takes this long
//! - `exit_after_ready_ms`: exit (code 1) this long after becoming ready
//! - `tokens`, `token_ms`: length and pace of every completion
//! - `stamp`: each streamed token's text is `t<unix µs when sent> ` (scripts/bench/upstream
//!   reads how long a token took to reach the client)
//! - `crash_after_tokens`: SIGKILL itself after sending this many tokens
//! - `hang_before_headers`: accept requests and never answer
//! - `hang_after_tokens`: stop sending (keep the connection) after this many tokens
//! - `garbage`: answer generation requests with bytes that are not HTTP
//! - `die_on_request`: exit (code 1) as soon as a generation request arrives
//! - `ignore_sigterm`: keep running on SIGTERM
//! - `drain_ms`: take this long to answer `/admin/drain`
//! - `stderr_flood_mb`: once ready, print this many MB on stderr as fast as it can (one
//!   1 MB line without a newline first, then short lines)
//! - `fork_grandchild`: once ready, start a `sleep` in its own process group (a helper
//!   that must not outlive the engine)
//!
//! Like `corral engine`, `/admin/drain?timeout_ms=T` stops admitting (new generation
//! requests get 503 `engine_draining`), waits up to T for the requests in flight, cuts
//! those still running (a stream gets a terminal `engine_draining` event and ends; a
//! whole answer is a 503) and then answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use corral_protocol::engine_wire::{EngineEvent, EngineStats, Ready};
use corral_protocol::launch::{find_arg, flag};
use serde_json::{Value, json};

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
static DRAINING: AtomicBool = AtomicBool::new(false);
static CUT: AtomicBool = AtomicBool::new(false);

const DRAINING_ERROR: &str = r#"{"error":{"message":"the request was cut short: the engine is stopping","type":"server_error","param":null,"code":"engine_draining"}}"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = find_arg(&args, flag::MODEL).expect("--model");
    let socket = find_arg(&args, flag::SOCKET).expect("--socket");
    let id = find_arg(&args, flag::ID).unwrap_or_else(|| "fake".into());
    let cfg: Value =
        std::fs::read_to_string(&model).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(json!({}));
    if let Some(line) = cfg["stderr"].as_str() {
        eprintln!("{line}");
    }
    if let Some(code) = cfg["exit_at_start"].as_i64() {
        std::process::exit(code as i32);
    }
    std::thread::sleep(Duration::from_millis(cfg["load_ms"].as_u64().unwrap_or(50)));
    if !cfg["ignore_sigterm"].as_bool().unwrap_or(false) {
        let mut sigs = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM]).unwrap();
        let sock = socket.clone();
        std::thread::spawn(move || {
            if sigs.forever().next().is_some() {
                let _ = std::fs::remove_file(&sock);
                std::process::exit(0);
            }
        });
    } else {
        let _ = signal_hook::flag::register(
            signal_hook::consts::SIGTERM,
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
    }
    // Parent gone (stdin EOF): exit.
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        while std::io::stdin().read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
        std::process::exit(0);
    });
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).expect("bind");
    let ready =
        Ready { pid: std::process::id(), socket: socket.clone(), model: id.clone(), load_ms: 1, device: "cpu".into() };
    println!("{}", EngineEvent::Ready(ready).to_line());
    std::io::stdout().flush().unwrap();
    if let Some(mb) = cfg["stderr_flood_mb"].as_u64() {
        std::thread::spawn(move || flood_stderr(mb));
    }
    if cfg["fork_grandchild"].as_bool().unwrap_or(false) {
        // Same process group as the engine; no inherited pipes (it must not hold the
        // gateway's stderr reader open).
        let _ = std::process::Command::new("sleep")
            .arg("1000")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    if let Some(ms) = cfg["exit_after_ready_ms"].as_u64() {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            std::process::exit(1);
        });
    }
    for stream in listener.incoming().flatten() {
        let (cfg, id) = (cfg.clone(), id.clone());
        std::thread::spawn(move || serve(stream, &cfg, &id));
    }
}

fn respond(s: &mut UnixStream, status: &str, ctype: &str, body: &str) {
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn serve(mut stream: UnixStream, cfg: &Value, id: &str) {
    let mut r = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    let _ = r.read_exact(&mut body);
    let req: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    match (method.as_str(), path.split('?').next().unwrap_or("")) {
        ("GET", "/health") => respond(&mut stream, "200 OK", "application/json", r#"{"status":"ok"}"#),
        ("GET", "/v1/models") => {
            let card = json!({"object": "list", "data": [{"id": id, "object": "model", "created": 0, "owned_by": "corral", "context_window": 512}]});
            respond(&mut stream, "200 OK", "application/json", &card.to_string());
        }
        ("GET", "/admin/stats") => {
            let s = EngineStats {
                model: id.to_owned(),
                pid: std::process::id(),
                requests_total: REQUESTS.load(Ordering::Relaxed),
                ..Default::default()
            };
            respond(&mut stream, "200 OK", "application/json", &serde_json::to_string(&s).unwrap());
        }
        ("POST", "/admin/drain") => {
            std::thread::sleep(Duration::from_millis(cfg["drain_ms"].as_u64().unwrap_or(0)));
            let timeout = path.split("timeout_ms=").nth(1).and_then(|v| v.parse().ok()).unwrap_or(10_000);
            let cancelled = drain(Duration::from_millis(timeout));
            let body = json!({"drained": true, "demotions": 0, "cancelled": cancelled}).to_string();
            respond(&mut stream, "200 OK", "application/json", &body)
        }
        ("POST", "/v1/chat/completions" | "/v1/completions") if DRAINING.load(Ordering::SeqCst) => {
            respond(&mut stream, "503 Service Unavailable", "application/json", DRAINING_ERROR)
        }
        ("POST", "/v1/chat/completions" | "/v1/completions") => {
            REQUESTS.fetch_add(1, Ordering::Relaxed);
            IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
            generate(&mut stream, cfg, id, &req);
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
        _ => respond(
            &mut stream,
            "404 Not Found",
            "application/json",
            r#"{"error":{"message":"no route","type":"invalid_request_error","param":null,"code":"not_found"}}"#,
        ),
    }
}

/// Stop admitting, wait up to `timeout` for the requests in flight, cut the rest;
/// returns how many were cut.
fn drain(timeout: Duration) -> u64 {
    DRAINING.store(true, Ordering::SeqCst);
    let end = std::time::Instant::now() + timeout;
    while IN_FLIGHT.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let cut = IN_FLIGHT.load(Ordering::SeqCst);
    CUT.store(true, Ordering::SeqCst);
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while IN_FLIGHT.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    cut
}

fn flood_stderr(mb: u64) {
    let mut err = std::io::BufWriter::new(std::io::stderr().lock());
    let _ = err.write_all(&vec![b'#'; 1 << 20]);
    let line = format!("{}\n", "flood ".repeat(16));
    let lines = (mb.saturating_sub(1) << 20) / line.len() as u64;
    for _ in 0..lines {
        if err.write_all(line.as_bytes()).is_err() {
            return;
        }
    }
    let _ = err.flush();
}

fn generate(s: &mut UnixStream, cfg: &Value, id: &str, req: &Value) {
    if cfg["die_on_request"].as_bool().unwrap_or(false) {
        std::process::exit(1);
    }
    if cfg["hang_before_headers"].as_bool().unwrap_or(false) {
        std::thread::sleep(Duration::from_secs(3600));
    }
    if cfg["garbage"].as_bool().unwrap_or(false) {
        let _ = s.write_all(b"\x00\x01 this is not HTTP at all\r\n\r\n");
        return;
    }
    let n = req["max_tokens"].as_u64().unwrap_or(u64::MAX).min(cfg["tokens"].as_u64().unwrap_or(8));
    let pace = Duration::from_millis(cfg["token_ms"].as_u64().unwrap_or(5));
    let crash_after = cfg["crash_after_tokens"].as_u64();
    let hang_after = cfg["hang_after_tokens"].as_u64();
    let stamp = cfg["stamp"].as_bool().unwrap_or(false);
    let text = |i: u64| match stamp {
        true => format!("t{} ", std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_micros())),
        false => format!("tok{i} "),
    };
    let chunk = |i: u64| json!({"id": "fake", "object": "chat.completion.chunk", "model": id, "choices": [{"index": 0, "delta": {"content": text(i)}, "finish_reason": null}]});
    if req["stream"].as_bool().unwrap_or(false) {
        let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        let mut send = |data: String| {
            let ev = format!("data: {data}\n\n");
            write!(s, "{:x}\r\n{ev}\r\n", ev.len()).and_then(|_| s.flush()).is_ok()
        };
        for i in 0..n {
            if crash_after == Some(i) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
            }
            if hang_after == Some(i) {
                std::thread::sleep(Duration::from_secs(3600));
            }
            if CUT.load(Ordering::SeqCst) {
                send(DRAINING_ERROR.to_owned());
                let _ = write!(s, "0\r\n\r\n");
                return;
            }
            if !send(chunk(i).to_string()) {
                return;
            }
            std::thread::sleep(pace);
        }
        send(json!({"id": "fake", "object": "chat.completion.chunk", "model": id, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).to_string());
        send("[DONE]".into());
        let _ = write!(s, "0\r\n\r\n");
    } else {
        let mut text = String::new();
        for i in 0..n {
            if crash_after == Some(i) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
            }
            if CUT.load(Ordering::SeqCst) {
                return respond(s, "503 Service Unavailable", "application/json", DRAINING_ERROR);
            }
            text.push_str(&format!("tok{i} "));
            std::thread::sleep(pace);
        }
        let body = json!({"id": "fake", "object": "chat.completion", "model": id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1, "prompt_tokens_details": {"cached_tokens": 0}}});
        respond(s, "200 OK", "application/json", &body.to_string());
    }
}
