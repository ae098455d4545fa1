//! Shutdown of a real `corral serve` (fake engines, which drain like `corral engine`:
//! they finish what is in flight up to the drain deadline and cut the rest with a
//! terminal `engine_draining` event), rows 35–37 of the fault catalogue in
//! `docs/reliability.md`: short streams finish and the process exits 0 leaving nothing;
//! long streams are cut at the drain deadline with a terminal event; a second signal
//! kills the engines and exits at once.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::http::Sse;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true})
}

fn open_streams(gw: &Gateway, n: usize) -> Vec<std::thread::JoinHandle<(Vec<String>, bool)>> {
    (0..n)
        .map(|_| {
            let mut s: Sse = gw.stream("/v1/chat/completions", &chat());
            assert_eq!(s.status, 200);
            assert!(s.next_event().is_some(), "no first token");
            std::thread::spawn(move || {
                let events = s.collect();
                (events, s.body.complete)
            })
        })
        .collect()
}

fn engine_pid(gw: &Gateway) -> u32 {
    gw.engine_of("m")["pid"].as_u64().expect("an engine pid") as u32
}

#[test]
fn row35_sigterm_lets_short_streams_finish_then_exits_0_leaving_nothing() {
    // 40 tokens at 50 ms: about 2 s each.
    let mut gw = fake_gateway(&[("m", json!({"tokens": 40, "token_ms": 50}))], &[]);
    let streams = open_streams(&gw, 4);
    let pid = engine_pid(&gw);
    let t = Instant::now();
    gw.signal(Signal::SIGTERM);
    // New connections are refused soon after (the listener is closed).
    let refused = wait_until(Duration::from_secs(5), || TcpStream::connect(&gw.addr).is_err());
    assert!(refused, "still accepting connections {:?} after SIGTERM", t.elapsed());
    for s in streams {
        let (events, complete) = s.join().unwrap();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "a short stream was cut: {events:?}");
        assert!(complete);
    }
    let status = gw.wait_exit(Duration::from_secs(30)).expect("no exit after SIGTERM");
    eprintln!("SIGTERM with 4 short streams: exit {status} after {:?}", t.elapsed());
    assert_eq!(status.code(), Some(0), "{}", gw.log());
    assert!(!alive(pid), "the engine outlived the gateway");
    assert!(sockets_in(&gw.run_dir()).is_empty(), "{:?}", sockets_in(&gw.run_dir()));
}

#[test]
fn row36_sigterm_cuts_long_streams_at_the_drain_deadline_with_a_terminal_event() {
    let mut gw = fake_gateway(&[("m", json!({"tokens": 100_000, "token_ms": 20}))], &["--drain-timeout", "2s"]);
    let streams = open_streams(&gw, 3);
    let pid = engine_pid(&gw);
    let t = Instant::now();
    gw.signal(Signal::SIGTERM);
    for s in streams {
        let (events, _) = s.join().unwrap();
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap_or(Value::Null);
        assert_eq!(last["error"]["code"], "engine_draining", "{:?}", &events[events.len().saturating_sub(2)..]);
        assert!(!events.iter().any(|e| e == "[DONE]"));
    }
    let cut = t.elapsed();
    assert!(cut >= Duration::from_millis(1500), "cut before the drain deadline: {cut:?}");
    let status = gw.wait_exit(Duration::from_secs(60)).expect("no exit after SIGTERM");
    eprintln!("SIGTERM with long streams: cut after {cut:?}, exit {status} after {:?}", t.elapsed());
    assert_eq!(status.code(), Some(0), "{}", gw.log());
    // drain (2 s) + stop (10 s) + 1 s is the documented bound; 30 s for a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(!alive(pid));
    assert!(sockets_in(&gw.run_dir()).is_empty(), "{:?}", sockets_in(&gw.run_dir()));
}

#[test]
fn row37_a_second_signal_during_the_drain_kills_the_engines_and_exits_130() {
    // The engine takes 60 s to answer its drain: only the second signal ends this soon.
    let mut gw = fake_gateway(&[("m", json!({"tokens": 100_000, "token_ms": 20, "drain_ms": 60_000}))], &[]);
    let streams = open_streams(&gw, 1);
    let pid = engine_pid(&gw);
    gw.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(gw.child.try_wait().unwrap().is_none(), "exited before the second signal");
    let t = Instant::now();
    gw.signal(Signal::SIGTERM);
    let status = gw.wait_exit(Duration::from_secs(15)).expect("no exit after a second signal");
    eprintln!("second SIGTERM: exit {status} after {:?}", t.elapsed());
    assert_eq!(status.code(), Some(130), "{}", gw.log());
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(wait_until(Duration::from_secs(5), || !alive(pid)), "the engine outlived a forced exit");
    for s in streams {
        let (events, complete) = s.join().unwrap();
        assert!(!complete && !events.iter().any(|e| e == "[DONE]"), "{events:?}");
    }
}
