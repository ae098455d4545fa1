//! The gateway's UI routes against the real binary: the embedded page and files, and
//! `POST /api/models/{id}/load|unload` on the pool — with the fake engine for the API's
//! rules, and with the real SmolLM2 for an unload that saves the prompt cache to disk.

use std::time::Duration;

use crate::common::gateway::*;
use crate::common::*;
use serde_json::json;

fn post(gw: &Gateway, path: &str) -> crate::common::http::Response {
    gw.post(path, &json!({}))
}

#[test]
fn the_page_and_its_files_are_served_from_the_binary_without_starting_an_engine() {
    let gw = fake_gateway(&[("a", json!({}))], &[]);
    let page = gw.get("/");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.header("content-security-policy").unwrap().contains("default-src 'none'"));
    let html = page.text();
    assert!(html.contains(r#"src="/ui/app.js""#), "{html}");
    for file in ["app.js", "chat.js", "engines.js", "markdown.js", "base.css"] {
        let r = gw.get(&format!("/ui/{file}"));
        assert_eq!(r.status, 200, "{file}");
        assert!(!r.body.is_empty(), "{file}");
    }
    assert_eq!(gw.get("/ui/app.js").header("content-type"), Some("text/javascript; charset=utf-8"));
    let missing = gw.get("/ui/missing.js");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "not_found");
    let wrong = post(&gw, "/");
    assert_eq!((wrong.status, wrong.header("allow")), (405, Some("GET")));
    assert_eq!(gw.engine_of("a")["state"], "stopped", "the UI never wakes an engine");
    let by_route = &gw.stats()["gateway"]["requests_by_route"];
    assert_eq!(by_route["/"], 2, "{by_route}");
    assert_eq!(by_route["/ui/{file}"], 7, "{by_route}");
}

#[test]
fn load_starts_the_named_engine_and_unload_stops_it() {
    let gw = fake_gateway(&[("a", json!({"load_ms": 300})), ("b", json!({}))], &[]);
    let r = post(&gw, "/api/models/a/load");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!((v["model"].as_str(), v["state"].as_str()), (Some("a"), Some("ready")), "{v}");
    let pid = v["pid"].as_u64().unwrap() as u32;
    assert!(alive(pid));
    assert_eq!(gw.engine_of("a")["pid"], pid, "the answer is a's /engine entry");

    // Loading a ready model changes nothing.
    assert_eq!(post(&gw, "/api/models/a/load").json()["pid"], pid);

    // A pool of one: loading b evicts a once b is ready.
    let r = post(&gw, "/api/models/b/load");
    assert_eq!(r.json()["state"], "ready", "{}", r.text());
    assert!(wait_until(Duration::from_secs(10), || !alive(pid)), "a still runs: {}", gw.engine());

    let r = post(&gw, "/api/models/b/unload");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "stopped");
    assert!(r.json()["pid"].is_null());
    assert_eq!(gw.engine()["pool"]["resident"], json!([]));
    assert_eq!(gw.counter("evictions"), 1, "an unload is not counted as an eviction");
    // Unloading a stopped model is a no-op that says so.
    assert_eq!(post(&gw, "/api/models/b/unload").json()["state"], "stopped");
}

#[test]
fn model_controls_name_their_model_exactly_and_answer_errors_in_the_api_shape() {
    // One model: a chat request naming another id would be routed to it; a control never is.
    let gw = fake_gateway(&[("only", json!({}))], &[]);
    for action in ["load", "unload"] {
        let r = post(&gw, &format!("/api/models/other/{action}"));
        assert_eq!(r.status, 404, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["code"], "model_not_found", "{e}");
        assert_eq!(e["type"], "invalid_request_error");
        assert!(e["message"].as_str().unwrap().contains("only"), "{e}");
    }
    let get = gw.get("/api/models/only/load");
    assert_eq!((get.status, get.header("allow")), (405, Some("POST")));
    assert_eq!(gw.get("/api/models/only").status, 404);
    assert_eq!(gw.engine_of("only")["state"], "stopped");
}

#[test]
fn unload_clears_a_crash_loop_and_a_failed_load_says_why() {
    let gw = fake_gateway(&[("bad", json!({"exit_at_start": 78, "stderr": "not a GGUF file"}))], &[]);
    let r = post(&gw, "/api/models/bad/load");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "engine_config");
    assert!(r.text().contains("not a GGUF file"), "{}", r.text());
    assert_eq!(gw.engine_of("bad")["state"], "failed");
    let r = post(&gw, "/api/models/bad/unload");
    assert_eq!(r.json()["state"], "stopped", "{}", r.text());
    assert_eq!(gw.engine_of("bad")["last_exit"]["code"], 78, "the last exit is still shown");
}

#[test]
fn unloading_a_real_engine_drains_it_and_its_prompt_cache_reaches_the_ssd_tier() {
    let smol = model_path(SMOLLM);
    let gw = Gateway::start(&["--model", &format!("smol={}", smol.display()), "--threads", "1"]);
    let r = post(&gw, "/api/models/smol/load");
    assert_eq!(r.status, 200, "{}", r.text());
    let pid = r.json()["pid"].as_u64().unwrap() as u32;
    let chat = json!({"model": "smol", "messages": [{"role": "user", "content": "Name a color."}],
                      "max_tokens": 8, "temperature": 0});
    assert_eq!(gw.post("/v1/chat/completions", &chat).status, 200);
    let r = post(&gw, "/api/models/smol/unload");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "stopped");
    assert!(!alive(pid));
    assert_eq!(gw.engine_of("smol")["last_exit"]["code"], 0, "a clean, asked-for exit");
    let kv = gw.dir.path().join("kv");
    // Entries live in one directory per model fingerprint (`tokenizers/` is another cache).
    let files: Vec<_> = walk(&kv).into_iter().filter(|p| !p.starts_with(kv.join("tokenizers"))).collect();
    assert!(!files.is_empty(), "the drain wrote the prompt cache under {}", kv.display());
    // And the next request brings it back.
    assert_eq!(gw.post("/v1/chat/completions", &chat).status, 200);
    assert_eq!(gw.engine_of("smol")["state"], "ready");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}
