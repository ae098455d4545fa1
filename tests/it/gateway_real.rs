//! `corral serve` with the two real models and real engine children: switching with a
//! pool of one, an engine killed under load, and the gateway's own shutdown and death.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::gateway::*;
use crate::common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn model_arg(id: &str, file: &str) -> String {
    format!("{id}={}", model_path(file).display())
}

/// A gateway over SmolLM2 as `smol` and Gemma 3 as `gemma`, one engine thread each.
fn real_gateway(extra: &[&str]) -> Gateway {
    let (a, b) = (model_arg("smol", SMOLLM), model_arg("gemma", GEMMA));
    let mut args = vec!["--model", &a, "--model", &b, "--threads", "1"];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

fn chat(model: &str, stream: bool, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Tell me a long story about a fox."}],
           "stream": stream, "max_tokens": max_tokens, "temperature": 0})
}

fn pid_of(gw: &Gateway, model: &str) -> u32 {
    gw.engine_of(model)["pid"].as_u64().unwrap_or_else(|| panic!("{model} has no pid: {}", gw.engine())) as u32
}

fn all_ready(gw: &Gateway) -> bool {
    gw.engine()["engines"].as_array().unwrap().iter().all(|e| e["state"] == "ready")
}

#[test]
fn switching_a_b_a_with_a_pool_of_one_keeps_a_serving_while_b_loads() {
    let gw = real_gateway(&["--model-pool", "1"]);
    let r = gw.post("/v1/chat/completions", &chat("smol", false, 4));
    assert_eq!(r.status, 200, "{}", r.text());
    let smol_pid = pid_of(&gw, "smol");

    // Ask for gemma from another thread; while it loads, smol keeps answering.
    let addr = gw.addr.clone();
    let switch = std::thread::spawn(move || {
        let t = Instant::now();
        let r = crate::common::http::request(
            crate::common::http::tcp(&addr),
            "POST",
            "/v1/chat/completions",
            Some(chat("gemma", false, 4).to_string().as_bytes()),
            &[],
        );
        (r.status, r.text(), t.elapsed())
    });
    assert!(wait_until(Duration::from_secs(10), || gw.engine_of("gemma")["state"] == "starting"), "{}", gw.engine());
    let mut served_during_load = 0;
    while gw.engine_of("gemma")["state"] == "starting" {
        let r = gw.post("/v1/chat/completions", &chat("smol", false, 2));
        assert_eq!(r.status, 200, "smol must keep serving while gemma loads: {}", r.text());
        if gw.engine_of("gemma")["state"] == "starting" {
            assert_eq!(pid_of(&gw, "smol"), smol_pid, "smol serves from its original engine during the load");
            served_during_load += 1;
        }
    }
    let (status, text, took) = switch.join().unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(served_during_load >= 1, "gemma loaded before smol could be asked (took {took:?})");

    // Then smol is drained and stopped: its process and socket are gone.
    assert!(wait_until(Duration::from_secs(15), || !alive(smol_pid)), "smol engine still running: {}", gw.engine());
    // A smol request that raced gemma's arrival may have started a new smol (that is
    // the pool serving it, correctly); asking for gemma settles the pool on gemma.
    assert_eq!(gw.post("/v1/chat/completions", &chat("gemma", false, 2)).status, 200);
    let (switches, evictions) = (gw.counter("switches"), gw.counter("evictions"));
    // The pool records the stop once it has reaped the process, just after it exits.
    assert!(
        wait_until(Duration::from_secs(5), || gw.engine()["pool"]["resident"] == json!(["gemma"])),
        "{}",
        gw.engine()
    );
    assert_eq!(gw.engine_of("smol")["state"], "stopped");
    assert!(gw.engine_of("smol")["pid"].is_null());
    assert_eq!(sockets_in(&gw.run_dir()).len(), 1, "{:?}", sockets_in(&gw.run_dir()));

    // And back: gemma goes, smol comes back in a new engine.
    let gemma_pid = pid_of(&gw, "gemma");
    let r = gw.post("/v1/chat/completions", &chat("smol", false, 4));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(pid_of(&gw, "smol"), smol_pid);
    assert!(wait_until(Duration::from_secs(15), || !alive(gemma_pid)), "gemma engine still running");
    let s = gw.stats()["gateway"].clone();
    assert_eq!(s["switches"], switches + 1, "{s}");
    assert!(s["last_switch_ms"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["evictions"], evictions + 1, "{s}");
    // The pool marks gemma stopped once it has reaped the process (just after it exits).
    let resident = || -> Vec<String> {
        let models = gw.get("/v1/models").json();
        let data = models["data"].as_array().unwrap().clone();
        data.iter().filter(|m| m["resident"] == true).map(|m| m["id"].as_str().unwrap().to_owned()).collect()
    };
    assert!(wait_until(Duration::from_secs(5), || resident() == ["smol"]), "{:?}", resident());
}

#[test]
fn kill_9_of_an_engine_under_four_streams_ends_each_with_an_error_and_the_gateway_lives() {
    let gw = real_gateway(&[]);
    let gateway_pid = gw.child.id();
    assert_eq!(gw.post("/v1/chat/completions", &chat("smol", false, 2)).status, 200);
    let engine_pid = pid_of(&gw, "smol");
    let events = Arc::new(AtomicUsize::new(0));
    let streams: Vec<_> = (0..4)
        .map(|_| {
            let (addr, events) = (gw.addr.clone(), events.clone());
            std::thread::spawn(move || {
                let mut s = crate::common::http::Sse::open(
                    crate::common::http::tcp(&addr),
                    "/v1/chat/completions",
                    chat("smol", true, 400).to_string().as_bytes(),
                    &[],
                );
                let mut got = Vec::new();
                if s.status == 200 {
                    while let Some(ev) = s.next_event() {
                        events.fetch_add(1, Ordering::Relaxed);
                        got.push(ev);
                    }
                } else {
                    got.push(String::from_utf8_lossy(&s.body.read_all()).into_owned());
                }
                (s.status, got, s.body.complete, Instant::now())
            })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(30), || events.load(Ordering::Relaxed) >= 3), "no tokens streamed");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(engine_pid as i32), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    for t in streams {
        let (status, got, complete, ended) = t.join().unwrap();
        assert!(ended.duration_since(killed) < Duration::from_secs(5), "a stream took {:?} to end", ended - killed);
        let last: Value = serde_json::from_str(got.last().expect("some event")).unwrap_or(Value::Null);
        if status == 200 {
            assert!(!complete, "a cut stream must not end cleanly");
            assert!(!got.iter().any(|e| e == "[DONE]"), "{got:?}");
            assert_eq!(last["error"]["code"], "engine_unavailable", "{got:?}");
        } else {
            // Still queued in the engine when it died (no head sent yet).
            assert_eq!(status, 502, "{got:?}");
            assert_eq!(last["error"]["code"], "engine_unavailable");
        }
    }
    assert!(alive(gateway_pid));
    assert_eq!(gw.get("/health").status, 200);
    let e = gw.engine_of("smol");
    assert_eq!(e["last_exit"]["signal"], 9, "{e}");
    let r = gw.post("/v1/chat/completions", &chat("smol", false, 4));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(pid_of(&gw, "smol"), engine_pid);
    assert_eq!(gw.engine_of("smol")["restarts"], 1);
}

#[test]
fn sigterm_under_load_exits_cleanly_leaving_no_engines_or_sockets() {
    let mut gw =
        real_gateway(&["--model-pool", "2", "--preload", "smol", "--preload", "gemma", "--drain-timeout", "3s"]);
    assert!(wait_until(Duration::from_secs(60), || all_ready(&gw)), "{}", gw.engine());
    let pids = [pid_of(&gw, "smol"), pid_of(&gw, "gemma")];
    let streams: Vec<_> = ["smol", "gemma"]
        .into_iter()
        .map(|m| {
            let addr = gw.addr.clone();
            std::thread::spawn(move || {
                let mut s = crate::common::http::Sse::open(
                    crate::common::http::tcp(&addr),
                    "/v1/chat/completions",
                    chat(m, true, 2000).to_string().as_bytes(),
                    &[],
                );
                let events = s.collect();
                (s.status, events)
            })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(30), || gw.engine()["engines"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["in_flight"] == 1)));
    std::thread::sleep(Duration::from_millis(300));
    gw.signal(Signal::SIGTERM);
    let status = gw.wait_exit(Duration::from_secs(30)).expect("gateway did not exit after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", gw.log());
    for t in streams {
        let (status, events) = t.join().unwrap();
        assert_eq!(status, 200);
        // Either finished within the drain deadline or cut with a terminal error.
        let last = events.last().cloned().unwrap_or_default();
        assert!(last == "[DONE]" || last.contains("\"error\""), "stream ended with {last:?}");
    }
    for pid in pids {
        assert!(!alive(pid), "engine {pid} outlived the gateway");
    }
    assert!(sockets_in(&gw.run_dir()).is_empty(), "{:?}", sockets_in(&gw.run_dir()));
}

#[test]
fn kill_9_of_the_gateway_takes_its_engines_down_within_a_second() {
    let gw = real_gateway(&["--model-pool", "2", "--preload", "smol", "--preload", "gemma"]);
    assert!(wait_until(Duration::from_secs(60), || all_ready(&gw)), "{}", gw.engine());
    let pids = [pid_of(&gw, "smol"), pid_of(&gw, "gemma")];
    assert!(pids.iter().all(|&p| alive(p)));
    gw.signal(Signal::SIGKILL);
    let t = Instant::now();
    assert!(
        wait_until(Duration::from_secs(1), || pids.iter().all(|&p| !alive(p))),
        "engines alive {:?} after the gateway died",
        t.elapsed()
    );
}

#[test]
fn routes_by_model_id_and_reports_unknown_ones() {
    let gw = real_gateway(&["--model-pool", "2"]);
    let r = gw.post("/v1/chat/completions", &chat("llama3", false, 2));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert_eq!(gw.post("/admin/drain", &json!({})).status, 404);
    let r = gw.post("/v1/chat/completions", &chat("gemma", false, 3)).json();
    assert_eq!(r["model"], "gemma");
    let r = gw
        .post(
            "/v1/completions",
            &json!({"model": "smol", "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}),
        )
        .json();
    assert_eq!(r["model"], "smol", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 3, "{r}");
    let s = gw.stats();
    assert!(s["engines"]["smol"]["requests_total"].as_u64().is_some(), "{s}");
    assert!(s["engines"]["gemma"].is_object(), "{s}");
}
