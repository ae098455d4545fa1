//! Upstream models on real servers over loopback: a front `corral serve` whose model
//! `big` is served by two other `corral serve` processes (replicas) under their name
//! `smol`, with their API key taken from an environment variable; and llama.cpp's
//! `llama-server` as an upstream when it has been built (`scripts/peer/build`, or
//! `$LLAMA_SERVER`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::gateway::{Gateway, wait_until};
use crate::common::upstream::{
    CLUSTER_KEY, FRONT_KEY, KEY_VAR, call, chat, front, replica, stream, streamed_text, upstream_of,
};
use crate::common::{SMOLLM, TempDir, model_path};
use prom_text_format_parser::{Scrape, ValueType};
use serde_json::{Value, json};

fn replica_health(front: &Gateway, model: &str, url: &str) -> String {
    let u = upstream_of(front, model);
    let r = u["replicas"].as_array().unwrap().iter().find(|r| r["url"] == url).cloned().unwrap_or(Value::Null);
    r["health"].as_str().unwrap_or("").to_owned()
}

fn chat_requests_of(gw: &Gateway) -> u64 {
    let s = call(&gw.addr, "GET", "/stats", None, CLUSTER_KEY).json();
    s["gateway"]["requests_by_route"]["/v1/chat/completions"].as_u64().unwrap_or(0)
}

fn metric(s: &Scrape, name: &str, kind: ValueType, labels: &[(&str, &str)]) -> Option<f64> {
    let m = s.metrics.iter().find(|m| m.name == name)?;
    m.samples
        .iter()
        .filter(|x| x.value.value_type == kind)
        .find(|x| {
            x.labels.iter().filter(|l| l.key != "le").count() == labels.len()
                && labels.iter().all(|(k, v)| x.labels.iter().any(|l| l.key == *k && l.value == *v))
        })
        .map(|x| x.value.value.as_f64())
}

#[test]
fn two_corral_replicas_behind_one_front_door() {
    let (b1, b2) = (replica(None), replica(None));
    let (u1, u2) = (format!("http://{}", b1.addr), format!("http://{}", b2.addr));
    let config = format!(
        "[models.big]\nupstream = [\"{u1}\", \"{u2}/v1\"]\nupstream-model = \"smol\"\napi-key-env = \"{KEY_VAR}\"\n\
         aliases = [\"cluster\"]\nhealth-interval = \"300ms\"\nconnect-timeout = \"2s\"\n\n\
         [models.unmapped]\nupstream = \"{u1}\"\napi-key-env = \"{KEY_VAR}\"\nhealth-interval = \"300ms\"\n\n\
         [models.nokey]\nupstream = \"{u2}\"\nhealth-interval = \"300ms\"\n"
    );
    let a = front(&config, TempDir::new("upstream-front"));
    assert!(wait_until(Duration::from_secs(20), || upstream_of(&a, "big")["state"] == "ready"), "{}", a.log());
    let up = |u: &str| replica_health(&a, "big", u) == "up";
    assert!(wait_until(Duration::from_secs(20), || up(&u1) && up(&u2)), "{}", upstream_of(&a, "big"));

    // /v1/models lists the upstream models with what the replicas report.
    let models = call(&a.addr, "GET", "/v1/models", None, FRONT_KEY).json();
    let card = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "big").cloned().unwrap();
    assert_eq!((card["owned_by"].as_str(), card["context_window"].as_u64()), (Some("corral"), Some(4096)), "{card}");
    assert_eq!(card["capabilities"]["anthropic_messages"], true, "{card}");
    assert_eq!(models["data"].as_array().unwrap().len(), 3, "{models}");

    // Non-stream: the front door answers what the replica answers, under the replica's
    // name for the model; the alias routes too.
    let direct = call(&b1.addr, "POST", "/v1/chat/completions", Some(&chat("smol", 8)), CLUSTER_KEY);
    assert_eq!(direct.status, 200, "{}", direct.text());
    for name in ["big", "cluster"] {
        let via = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat(name, 8)), FRONT_KEY);
        assert_eq!(via.status, 200, "{}", via.text());
        let (v, d) = (via.json(), direct.json());
        assert_eq!(v["model"], "smol", "the upstream was asked for its own name: {v}");
        assert_eq!(v["choices"][0]["message"]["content"], d["choices"][0]["message"]["content"]);
    }
    // Without the mapping the replica is asked for `unmapped`, which it does not have:
    // its own 404 comes back as it is.
    let r = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat("unmapped", 4)), FRONT_KEY);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert!(r.text().contains("unmapped"), "{}", r.text());

    // Streaming passes through event by event: the same text, ending with [DONE].
    let mut body = chat("big", 8);
    body["stream"] = json!(true);
    let mut d = body.clone();
    d["model"] = json!("smol");
    let via = streamed_text(&mut stream(&a.addr, "/v1/chat/completions", &body, FRONT_KEY));
    let straight = streamed_text(&mut stream(&b1.addr, "/v1/chat/completions", &d, CLUSTER_KEY));
    assert_eq!(via, straight);
    assert!(!via.is_empty());
    let completion = json!({"model": "big", "prompt": "Once upon a time", "max_tokens": 4, "stream": true});
    let mut sse = stream(&a.addr, "/v1/completions", &completion, FRONT_KEY);
    assert_eq!(sse.status, 200);
    assert_eq!(sse.collect().last().map(String::as_str), Some("[DONE]"));

    // The replicas offer Messages (their cards say so), so it goes through.
    let msg = json!({"model": "big", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    let r = call(&a.addr, "POST", "/v1/messages", Some(&msg), FRONT_KEY);
    assert_eq!((r.status, r.json()["type"].as_str()), (200, Some("message")), "{}", r.text());

    // Without the key, the replica refuses the health check: out, and requests are told why.
    assert!(wait_until(Duration::from_secs(20), || upstream_of(&a, "nokey")["state"] == "down"));
    let r = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat("nokey", 4)), FRONT_KEY);
    assert_eq!(r.status, 502, "{}", r.text());
    let e = r.json();
    assert!(e["error"]["message"].as_str().unwrap().contains("upstream nokey") && r.text().contains("401"), "{e}");
    // An API it does not offer is a 501 in that API's own shape, naming the upstream.
    let r = call(
        &a.addr,
        "POST",
        "/v1/messages",
        Some(&json!({"model": "nokey", "max_tokens": 4, "messages": []})),
        FRONT_KEY,
    );
    assert_eq!(r.status, 501, "{}", r.text());
    let e = r.json();
    assert_eq!((e["type"].as_str(), e["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
    assert!(e["error"]["message"].as_str().unwrap().contains(&u2), "{e}");
    let r = call(&a.addr, "POST", "/v1/responses", Some(&json!({"model": "nokey", "input": "Hi"})), FRONT_KEY);
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (501, Some("not_implemented")), "{}", r.text());

    kill_one_replica_under_load(&a, b1, &b2, &u1);

    // The key went upstream, and nowhere else.
    for path in ["/engine", "/stats", "/metrics", "/v1/models"] {
        let text = call(&a.addr, "GET", path, None, FRONT_KEY).text();
        assert!(!text.contains(CLUSTER_KEY), "{path} shows the key");
    }
    assert!(upstream_of(&a, "big")["api_key"] == true);
    assert!(!a.log().contains(CLUSTER_KEY), "the log shows the key");
}

/// Eight clients send requests while one replica is killed with SIGKILL: every request is
/// answered (those on the dead replica that had no answer yet go to the other), the
/// replica is taken out, and once restarted on its port the health check puts it back.
fn kill_one_replica_under_load(a: &Gateway, mut b1: Gateway, b2: &Gateway, u1: &str) {
    let port: u16 = b1.addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let served_by_b2 = chat_requests_of(b2);
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let addr = a.addr.clone();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (addr, done, failed) = (addr.clone(), done.clone(), failed.clone());
            std::thread::spawn(move || {
                for j in 0..4 {
                    let mut body = chat("big", 16);
                    body["messages"][0]["content"] = json!(format!("Client {i}, request {j}: name three colors."));
                    let r = call(&addr, "POST", "/v1/chat/completions", Some(&body), FRONT_KEY);
                    let ok = r.status == 200 && r.json()["choices"][0]["message"]["content"].is_string();
                    if !ok {
                        eprintln!("lost: {} {}", r.status, r.text());
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Kill once work is under way on both replicas.
    assert!(wait_until(Duration::from_secs(60), || done.load(Ordering::Relaxed) >= 4));
    let on_b1 = upstream_of(a, "big")["replicas"][0]["in_flight"].as_u64().unwrap_or(0);
    b1.child.kill().unwrap();
    b1.child.wait().unwrap();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!((done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed)), (32, 0), "every request answered");
    assert!(chat_requests_of(b2) > served_by_b2, "the other replica took the load");
    let u = upstream_of(a, "big");
    assert_eq!(u["replicas"][0]["health"], "down", "{u}");
    assert!(on_b1 >= 1, "the kill came with requests in flight on the replica");
    assert!(u["retries"].as_u64().unwrap() >= 1, "requests in flight on the dead replica went on: {u}");
    assert!(u["replicas"][0]["failures"].as_u64().unwrap() >= 1, "{u}");

    // Back on its port: the health check puts it back, and it takes requests again.
    drop(b1);
    let b1 = replica(Some(port));
    assert!(wait_until(Duration::from_secs(20), || replica_health(a, "big", u1) == "up"), "{}", upstream_of(a, "big"));
    for _ in 0..4 {
        let r = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat("big", 4)), FRONT_KEY);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(chat_requests_of(&b1) >= 1, "the restarted replica serves again");

    // /engine and /metrics say it all.
    let u = upstream_of(a, "big");
    assert_eq!(
        (u["state"].as_str(), u["upstream_model"].as_str(), u["in_flight"].as_u64()),
        (Some("ready"), Some("smol"), Some(0))
    );
    for r in u["replicas"].as_array().unwrap() {
        assert!(r["mean_latency_ms"].as_f64().is_some_and(|ms| ms > 0.0) && r["requests"].as_u64().unwrap() > 0, "{r}");
    }
    let text = call(&a.addr, "GET", "/metrics", None, FRONT_KEY).text();
    let m = Scrape::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    let l1 = [("model", "big"), ("replica", u1)];
    assert_eq!(metric(&m, "corral_upstream_up", ValueType::Sample, &l1), Some(1.0));
    assert!(metric(&m, "corral_upstream_failures_total", ValueType::Sample, &l1).is_some_and(|n| n >= 1.0));
    assert!(metric(&m, "corral_upstream_requests_total", ValueType::Sample, &l1).is_some_and(|n| n >= 1.0));
    assert!(metric(&m, "corral_upstream_response_seconds", ValueType::Count, &l1).is_some_and(|n| n >= 1.0));
    assert_eq!(metric(&m, "corral_upstream_in_flight", ValueType::Sample, &l1), Some(0.0));
    let route = [("route", "/v1/chat/completions"), ("status", "200")];
    assert!(metric(&m, "corral_http_requests_total", ValueType::Sample, &route).is_some_and(|n| n >= 36.0));
}

/// A client that hangs up mid-stream cancels the generation on the replica.
#[test]
fn a_client_leaving_cancels_the_upstream_generation() {
    let b = replica(None);
    let config = format!(
        "[models.big]\nupstream = \"http://{}\"\nupstream-model = \"smol\"\napi-key-env = \"{KEY_VAR}\"\n",
        b.addr
    );
    let a = front(&config, TempDir::new("upstream-cancel"));
    let body = json!({"model": "big", "prompt": "The history of the river valley", "max_tokens": 4000,
                      "ignore_eos": true, "stream": true});
    let mut sse = stream(&a.addr, "/v1/completions", &body, FRONT_KEY);
    assert_eq!(sse.status, 200);
    assert!(sse.next_event().is_some());
    drop(sse);
    // 4,000 tokens take minutes on one thread; the replica must stop long before.
    let stopped = wait_until(Duration::from_secs(30), || {
        let s = call(&b.addr, "GET", "/stats", None, CLUSTER_KEY).json();
        s["gateway"]["in_flight"] == 0 && s["engines"]["smol"]["requests_cancelled"].as_u64() == Some(1)
    });
    assert!(stopped, "{}", call(&b.addr, "GET", "/stats", None, CLUSTER_KEY).text());
}

/// llama.cpp's server: built by `scripts/peer/build` (or named by `$LLAMA_SERVER`).
fn llama_server_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("LLAMA_SERVER") {
        return Some(p.into());
    }
    let peer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/peer");
    let mut found: Vec<_> = std::fs::read_dir(peer).ok()?.flatten().map(|e| e.path().join("llama-server")).collect();
    found.sort();
    found.into_iter().rfind(|p| p.is_file())
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn llama_server_as_an_upstream() {
    let Some(bin) = llama_server_bin() else {
        eprintln!("llama_server_as_an_upstream: no llama-server (scripts/peer/build builds it); not run");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = Killed(
        std::process::Command::new(&bin)
            .args(["-m"])
            .arg(model_path(SMOLLM))
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-t", "1", "-c", "2048", "-np", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start llama-server"),
    );
    let config = format!("[models.llama]\nupstream = \"http://127.0.0.1:{port}\"\nhealth-interval = \"300ms\"\n");
    let a = front(&config, TempDir::new("upstream-llama"));
    assert!(
        wait_until(Duration::from_secs(60), || upstream_of(&a, "llama")["state"] == "ready"),
        "{}",
        upstream_of(&a, "llama")
    );

    let r = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat("llama", 8)), FRONT_KEY);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
    let mut body = chat("llama", 8);
    body["stream"] = json!(true);
    assert!(!streamed_text(&mut stream(&a.addr, "/v1/chat/completions", &body, FRONT_KEY)).is_empty());
    // Its /v1/models reports no capabilities: only the OpenAI baseline is assumed.
    let r = call(
        &a.addr,
        "POST",
        "/v1/messages",
        Some(&json!({"model": "llama", "max_tokens": 4, "messages": []})),
        FRONT_KEY,
    );
    assert_eq!((r.status, r.json()["type"].as_str()), (501, Some("error")), "{}", r.text());
    assert!(r.text().contains(&format!("http://127.0.0.1:{port}")), "{}", r.text());
}
