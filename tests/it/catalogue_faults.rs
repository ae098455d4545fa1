//! Engine faults at a real `corral serve` (fake engines), the rows of the fault catalogue
//! in `docs/reliability.md` that the older fault tests covered only in part: `kill -9`
//! under eight streams and two whole requests, a crash loop beside a healthy model, an
//! engine stopped (SIGSTOP) before its head and mid-stream, garbage recycles the engine,
//! a 100 MB stderr flood, a forked helper, an engine that ignores SIGTERM, a gateway
//! `kill -9` and a restart over its stale sockets, and which engine an eviction picks.

use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::http::{self, Sse};
use crate::common::procfs;
use crate::common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

fn pid_of(gw: &Gateway, model: &str) -> u32 {
    gw.engine_of(model)["pid"].as_u64().unwrap_or_else(|| panic!("{model} has no pid: {}", gw.engine())) as u32
}

fn signal(pid: u32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

fn last_error_code(events: &[String]) -> Value {
    let last: Value = serde_json::from_str(events.last().map(String::as_str).unwrap_or("null")).unwrap_or(Value::Null);
    last["error"]["code"].clone()
}

#[test]
fn row18_kill_9_under_eight_streams_and_two_whole_requests() {
    let gw = fake_gateway(&[("m", json!({"tokens": 3000, "token_ms": 10}))], &[]);
    assert_eq!(gw.post("/v1/chat/completions", &json!({"model": "m", "max_tokens": 1})).status, 200);
    let pid = pid_of(&gw, "m");
    let streams: Vec<Sse> = (0..8).map(|_| gw.stream("/v1/chat/completions", &chat("m", true))).collect();
    let whole: Vec<_> = (0..2)
        .map(|_| {
            let addr = gw.addr.clone();
            std::thread::spawn(move || {
                let body = chat("m", false).to_string();
                let r = http::request(http::tcp(&addr), "POST", "/v1/chat/completions", Some(body.as_bytes()), &[]);
                (r, Instant::now())
            })
        })
        .collect();
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            assert_eq!(s.status, 200);
            assert!(s.next_event().is_some(), "no first token");
            std::thread::spawn(move || {
                let events = s.collect();
                (events, s.body.complete, Instant::now())
            })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(30), || gw.engine_of("m")["in_flight"] == 10), "{}", gw.engine());
    signal(pid, Signal::SIGKILL);
    let killed = Instant::now();
    for t in readers {
        let (events, complete, ended) = t.join().unwrap();
        assert!(ended - killed < Duration::from_secs(10), "a stream took {:?} to end", ended - killed);
        assert!(!complete, "a cut stream must not end its chunked body cleanly");
        assert!(!events.iter().any(|e| e == "[DONE]"), "{:?}", &events[events.len().saturating_sub(3)..]);
        assert_eq!(last_error_code(&events), "engine_unavailable");
    }
    for t in whole {
        let (r, ended) = t.join().unwrap();
        assert!(ended - killed < Duration::from_secs(10), "a whole request took {:?} to end", ended - killed);
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (502, Some("engine_unavailable")), "{}", r.text());
    }
    assert!(alive(gw.child.id()));
    assert_eq!(gw.post("/v1/chat/completions", &json!({"model": "m", "max_tokens": 2})).status, 200);
    assert_ne!(pid_of(&gw, "m"), pid);
    assert_eq!(gw.engine_of("m")["restarts"], 1);
}

#[test]
fn row20_a_crash_loop_leaves_the_other_model_serving() {
    let gw =
        fake_gateway(&[("loop", json!({"exit_at_start": 1})), ("good", json!({"tokens": 3}))], &["--model-pool", "2"]);
    let t = Instant::now();
    while gw.engine_of("loop")["state"] != "failed" && t.elapsed() < Duration::from_secs(30) {
        let r = gw.post("/v1/chat/completions", &chat("loop", false));
        assert_eq!(r.status, 503, "{}", r.text());
        let r = gw.post("/v1/chat/completions", &chat("good", false));
        assert_eq!(r.status, 200, "the healthy model failed while the other crash-looped: {}", r.text());
    }
    assert_eq!(gw.engine_of("loop")["state"], "failed", "{}", gw.engine());
    assert_eq!(gw.engine_of("good")["state"], "ready");
    assert_eq!(gw.engine_of("good")["restarts"], 0);
}

#[test]
fn row22_row23_a_stopped_engine_times_out_is_killed_and_replaced() {
    let gw = fake_gateway(
        &[("m", json!({"tokens": 400, "token_ms": 10}))],
        &["--engine-timeout", "1s", "--stall-timeout", "1s"],
    );
    // Before the head: SIGSTOP, then a request.
    assert_eq!(gw.post("/v1/chat/completions", &json!({"model": "m", "max_tokens": 1})).status, 200);
    let pid = pid_of(&gw, "m");
    signal(pid, Signal::SIGSTOP);
    let r = gw.post("/v1/chat/completions", &chat("m", false));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (504, Some("engine_timeout")), "{}", r.text());
    assert!(wait_until(Duration::from_secs(15), || !alive(pid)), "the hung engine was not killed");
    assert!(wait_until(Duration::from_secs(5), || procfs::group_members(pid).is_empty()), "its group survived");
    let killed = || gw.engine_of("m")["last_exit"]["signal"] == 9;
    assert!(wait_until(Duration::from_secs(5), killed), "{}", gw.engine());
    let r = gw.post("/v1/chat/completions", &json!({"model": "m", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    // Mid-stream: SIGSTOP after a few tokens.
    let pid = pid_of(&gw, "m");
    let mut s = gw.stream("/v1/chat/completions", &chat("m", true));
    for _ in 0..3 {
        assert!(s.next_event().is_some());
    }
    signal(pid, Signal::SIGSTOP);
    let t = Instant::now();
    let events = s.collect();
    assert!(t.elapsed() < Duration::from_secs(15), "the stall took {:?} to end the stream", t.elapsed());
    assert_eq!(last_error_code(&events), "engine_timeout", "{events:?}");
    assert!(!s.body.complete);
    assert!(wait_until(Duration::from_secs(15), || !alive(pid)), "the stalled engine was not killed");
    let r = gw.post("/v1/chat/completions", &json!({"model": "m", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(pid_of(&gw, "m"), pid);
}

#[test]
fn row24_garbage_recycles_the_engine() {
    let gw = fake_gateway(&[("junk", json!({"garbage": true}))], &[]);
    let r = gw.post("/v1/chat/completions", &chat("junk", false));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (502, Some("engine_unavailable")), "{}", r.text());
    assert!(
        wait_until(Duration::from_secs(15), || gw.engine_of("junk")["last_exit"]["signal"] == 9),
        "the engine that answered garbage was not recycled: {}",
        gw.engine()
    );
    assert_eq!(gw.get("/health").status, 200);
    assert_eq!(gw.post("/v1/chat/completions", &chat("junk", false)).status, 502, "a fresh engine, same garbage");
    assert_eq!(gw.engine_of("junk")["restarts"], 1);
}

#[test]
fn row27_a_100_mb_stderr_flood_costs_neither_pace_nor_memory() {
    let gw = fake_gateway(
        &[("flood", json!({"stderr_flood_mb": 100})), ("good", json!({"tokens": 3}))],
        &["--model-pool", "2", "--preload", "good"],
    );
    let gpid = gw.child.id();
    assert!(wait_until(Duration::from_secs(30), || gw.engine_of("good")["state"] == "ready"));
    let rss_before = procfs::rss_kib(gpid);
    assert_eq!(gw.post("/v1/chat/completions", &json!({"model": "flood", "max_tokens": 1})).status, 200);
    let fpid = pid_of(&gw, "flood");
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while procfs::bytes_written(fpid) < 100 << 20 && t0.elapsed() < Duration::from_secs(300) {
        let t = Instant::now();
        assert_eq!(gw.get("/health").status, 200);
        assert_eq!(gw.post("/v1/chat/completions", &chat("good", false)).status, 200);
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t0.elapsed();
    assert!(procfs::bytes_written(fpid) >= 100 << 20, "the flood did not finish in {took:?}");
    std::thread::sleep(Duration::from_secs(1));
    let grew = procfs::peak_rss_kib(gpid).saturating_sub(rss_before);
    let logged = gw.stderr.lock().unwrap().iter().filter(|l| l.contains("engine stderr")).count();
    let dropped = gw.stderr.lock().unwrap().iter().any(|l| l.contains("left out of the log"));
    eprintln!("100 MB flood in {took:?}: slowest request {worst:?}, peak RSS +{grew} KiB, {logged} lines logged");
    assert!(worst < Duration::from_secs(2), "a request took {worst:?} during the flood");
    assert!(grew < 64 * 1024, "the gateway's peak RSS grew by {grew} KiB");
    // 200 lines a second after a burst of 400 (`pool::stderr_limit`), with slack.
    let bound = 400 + 200 * (took.as_secs() as usize + 2) + 50;
    assert!(logged <= bound, "{logged} stderr lines logged in {took:?} (bound {bound})");
    assert!(dropped, "no line says how many were left out");
    assert_eq!(gw.post("/v1/chat/completions", &chat("flood", false)).status, 200);
}

#[test]
fn row28_a_helper_the_engine_forked_goes_with_it() {
    let gw = fake_gateway(&[("m", json!({"fork_grandchild": true}))], &["--drain-timeout", "1s"]);
    let group = |gw: &Gateway| {
        assert_eq!(gw.post("/v1/chat/completions", &chat("m", false)).status, 200);
        let pid = pid_of(gw, "m");
        assert!(wait_until(Duration::from_secs(10), || procfs::group_members(pid).len() == 2), "no helper");
        pid
    };
    // A stop through the stop path (unload: drain, SIGTERM to the group).
    let pid = group(&gw);
    assert_eq!(gw.post("/api/models/m/unload", &json!({})).status, 200);
    assert!(wait_until(Duration::from_secs(15), || procfs::group_members(pid).is_empty()), "after an unload");
    // A crash of the engine alone: its helper must not outlive it.
    let pid = group(&gw);
    signal(pid, Signal::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || procfs::group_members(pid).is_empty()),
        "after a crash: {:?} left in group {pid}",
        procfs::group_members(pid)
    );
}

#[test]
fn row29_an_engine_ignoring_sigterm_is_killed_at_the_stop_timeout() {
    let gw = fake_gateway(
        &[("stubborn", json!({"ignore_sigterm": true}))],
        &["--drain-timeout", "1s", "--stop-timeout", "2s"],
    );
    assert_eq!(gw.post("/v1/chat/completions", &chat("stubborn", false)).status, 200);
    let pid = pid_of(&gw, "stubborn");
    let t = Instant::now();
    assert_eq!(gw.post("/api/models/stubborn/unload", &json!({})).status, 200);
    assert!(wait_until(Duration::from_secs(30), || !alive(pid)), "still alive after {:?}", t.elapsed());
    let took = t.elapsed();
    eprintln!("an engine ignoring SIGTERM was gone {took:?} after its unload (stop timeout 2 s)");
    assert!(took >= Duration::from_secs(2), "killed before the stop timeout: {took:?}");
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("stubborn")["state"] == "stopped"));
    assert_eq!(gw.engine_of("stubborn")["last_exit"]["signal"], 9);
    assert_eq!(gw.post("/v1/chat/completions", &chat("stubborn", false)).status, 200, "the slot is free again");
}

#[test]
fn row30_after_a_gateway_kill_9_a_new_one_clears_the_stale_sockets() {
    let gw = fake_gateway(&[("a", json!({})), ("b", json!({}))], &["--model-pool", "2"]);
    for m in ["a", "b"] {
        assert_eq!(gw.post("/v1/chat/completions", &chat(m, false)).status, 200);
    }
    let pids = [pid_of(&gw, "a"), pid_of(&gw, "b")];
    let run = gw.run_dir();
    gw.signal(Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || pids.iter().all(|&p| !alive(p))), "engines outlived the gateway");
    let stale = sockets_in(&run);
    assert!(!stale.is_empty(), "the fake engines leave their sockets when killed; nothing to test");
    // A live socket in the directory means another corral: refused.
    let live = std::os::unix::net::UnixListener::bind(run.join("other.sock")).unwrap();
    let model = fake_model(gw.dir.path(), "c", json!({}));
    let args = ["serve", "--port", "0", "--runtime-dir", run.to_str().unwrap(), "--no-ssd-cache", "--no-open"];
    let engine = ["--engine-bin", fake_engine_bin(), "--model", model.to_str().unwrap()];
    let out = run_corral(&[&args[..], &engine[..]].concat(), Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another corral"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(live);
    let _ = std::fs::remove_file(run.join("other.sock"));
    // Only dead ones: removed, and the new gateway serves.
    let mut child = std::process::Command::new(bin())
        .args(args)
        .args(engine)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (log, first) = capture(&mut child);
    let line = first.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.is_ok(), "the new gateway did not start: {}", log.lock().unwrap().join("\n"));
    for s in &stale {
        assert!(!s.exists(), "{} is still there", s.display());
    }
}

#[test]
fn row31_eviction_takes_the_idle_engine_and_leaves_the_streaming_one() {
    let gw = fake_gateway(
        &[("a", json!({})), ("b", json!({"tokens": 150, "token_ms": 20})), ("c", json!({}))],
        &["--model-pool", "2"],
    );
    assert_eq!(gw.post("/v1/chat/completions", &chat("a", false)).status, 200);
    let mut b = gw.stream("/v1/chat/completions", &chat("b", true));
    assert!(b.next_event().is_some());
    let a_pid = pid_of(&gw, "a");
    assert_eq!(gw.post("/v1/chat/completions", &chat("c", false)).status, 200);
    assert!(wait_until(Duration::from_secs(15), || !alive(a_pid)), "a was not evicted: {}", gw.engine());
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("a")["state"] == "stopped"));
    assert_eq!(gw.engine_of("a")["last_exit"]["code"], 0, "a clean exit: {}", gw.engine());
    let rest = b.collect();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "b's stream was cut");
    assert!(b.body.complete);
    assert_eq!(gw.counter("evictions"), 1);
}
