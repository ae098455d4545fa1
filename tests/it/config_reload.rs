//! `corral serve --config FILE` and SIGHUP with real models and real engines: a model
//! added to the file while another streams (the stream finishes untouched), a model
//! dropped while it streams (its stream still finishes, then it is gone), and a broken
//! file that keeps the old configuration.

use std::path::Path;
use std::time::Duration;

use crate::common::gateway::*;
use crate::common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn table(id: &str, file: &str) -> String {
    format!("[models.{id}]\npath = {:?}\n", model_path(file).display().to_string())
}

fn start(file_text: &str) -> (Gateway, std::path::PathBuf) {
    let dir = TempDir::new("reload");
    let cfg = dir.path().join("corral.toml");
    std::fs::write(&cfg, file_text).unwrap();
    let arg = cfg.display().to_string();
    (Gateway::start_in(dir, &["--config", &arg]), cfg)
}

fn listed(gw: &Gateway) -> Vec<String> {
    let v = gw.get("/v1/models").json();
    v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

fn long_chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Tell me a long story about a fox."}],
           "stream": true, "max_tokens": 300, "temperature": 0})
}

fn rewrite(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Every event of the rest of a stream ends with `[DONE]`, none is an error, and it
/// carried text.
fn assert_finished(events: &[String]) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    assert!(!events.iter().any(|e| e.contains("\"error\"")), "{events:?}");
    assert!(events.len() > 10, "a long completion was cut short: {events:?}");
}

#[test]
fn sighup_adds_a_model_while_another_streams() {
    let (gw, cfg) = start(&format!("threads = 1\n{}", table("smol", SMOLLM)));
    assert_eq!(listed(&gw), ["smol"]);
    let mut s = gw.stream("/v1/chat/completions", &long_chat("smol"));
    let first = s.next_event().expect("a first event");
    let pid = gw.engine_of("smol")["pid"].as_u64().unwrap();

    rewrite(&cfg, &format!("threads = 1\n{}\n{}", table("smol", SMOLLM), table("gemma", GEMMA)));
    gw.signal(Signal::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || listed(&gw) == ["smol", "gemma"]),
        "{:?}\n{}",
        listed(&gw),
        gw.log()
    );

    let mut events = vec![first];
    events.extend(s.collect());
    assert_finished(&events);
    assert_eq!(gw.engine_of("smol")["pid"].as_u64(), Some(pid), "the streaming engine was not restarted");
    assert!(gw.log().contains("config reloaded"), "{}", gw.log());
    let r = gw.post(
        "/v1/chat/completions",
        &json!({"model": "gemma", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn sighup_drops_a_model_only_after_its_stream_finishes() {
    // Room for both engines and a drain deadline no loaded CI machine reaches: the
    // stream must end because it finished, not because a deadline or an eviction cut it.
    let head = "threads = 1\nmodel-pool = 2\ndrain-timeout = \"300s\"\n";
    let (gw, cfg) = start(&format!("{head}{}\n{}", table("smol", SMOLLM), table("gemma", GEMMA)));
    let mut s = gw.stream("/v1/chat/completions", &long_chat("smol"));
    let first = s.next_event().expect("a first event");
    let pid = gw.engine_of("smol")["pid"].as_u64().unwrap() as u32;

    rewrite(&cfg, &format!("{head}{}", table("gemma", GEMMA)));
    gw.signal(Signal::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || listed(&gw) == ["gemma"]), "{:?}\n{}", listed(&gw), gw.log());
    let r = gw.post(
        "/v1/chat/completions",
        &json!({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    // A lone model takes every request: the dropped name is no longer routed to its own.
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "gemma", "a dropped model is no longer routed");

    let mut events = vec![first];
    events.extend(s.collect());
    assert_finished(&events);
    assert!(wait_until(Duration::from_secs(15), || !alive(pid)), "the dropped model's engine stopped");
    assert!(wait_until(Duration::from_secs(5), || gw.engine_of("smol").is_null()), "{}", gw.engine());
}

#[test]
fn a_broken_file_on_sighup_keeps_the_old_models() {
    let (gw, cfg) = start(&format!("threads = 1\n{}", table("smol", SMOLLM)));
    rewrite(&cfg, &format!("threads = 1\nmodle-pool = 2\n{}\n{}", table("smol", SMOLLM), table("gemma", GEMMA)));
    gw.signal(Signal::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || gw.log().contains("reload failed")), "{}", gw.log());
    assert!(gw.log().contains("corral.toml:2: unknown key `modle-pool`"), "{}", gw.log());
    assert_eq!(listed(&gw), ["smol"]);
    let r = gw.post(
        "/v1/chat/completions",
        &json!({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn config_file_options_and_errors_at_start() {
    // The file sets the model pool; the command line's --port 0 (from the test harness)
    // wins over the file's port.
    let (gw, _cfg) = start(&format!("port = 1\nmodel-pool = 2\n{}", table("smol", SMOLLM)));
    assert_eq!(gw.engine()["pool"]["cap"], 2);
    let out = run_corral(&["serve", "--config", "/nonexistent/corral.toml"], Duration::from_secs(20));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/corral.toml"), "{err}");
}
