//! The API key on a real `corral serve`: without it or with another key every API and
//! control route is 401 in its own API's shape with `WWW-Authenticate: Bearer`; with it,
//! as a bearer token or as `x-api-key`, requests pass (a real SmolLM2 answers the
//! Anthropic form); `/health` and the UI's files stay open; the client verbs send it;
//! and a non-loopback bind without a key does not start.

use std::time::Duration;

use crate::common::gateway::*;
use crate::common::http::{self, Response};
use crate::common::{SMOLLM, TempDir, model_path, run_corral};
use serde_json::{Value, json};

const KEY: &str = "sk-corral-test-5f2d9a0c41e7b3";

fn call(gw: &Gateway, method: &str, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> Response {
    let bytes = body.map(Value::to_string);
    http::request(http::tcp(&gw.addr), method, path, bytes.as_deref().map(str::as_bytes), headers)
}

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

fn message() -> Value {
    json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

/// A 401 in OpenAI's shape (`invalid_api_key`) or Anthropic's (`authentication_error`).
fn assert_refused(r: &Response, anthropic: bool, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.text());
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{what}");
    let v = r.json();
    if anthropic {
        assert_eq!((v["type"].as_str(), v["error"]["type"].as_str()), (Some("error"), Some("authentication_error")));
    } else {
        assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn every_api_and_control_route_needs_the_key_in_either_header() {
    let gw = fake_gateway(&[("m", json!({"tokens": 3}))], &["--api-key", KEY]);
    let wrong = format!("Bearer {}", KEY.to_uppercase());
    let cases: [(&str, &str, Option<Value>, bool); 9] = [
        ("POST", "/v1/chat/completions", Some(chat()), false),
        ("POST", "/v1/completions", Some(json!({"model": "m", "prompt": "hi"})), false),
        ("POST", "/v1/messages", Some(message()), true),
        ("POST", "/v1/messages/count_tokens", Some(message()), true),
        ("POST", "/v1/responses", Some(json!({"model": "m", "input": "hi"})), false),
        ("GET", "/v1/models", None, false),
        ("GET", "/engine", None, false),
        ("GET", "/metrics", None, false),
        ("POST", "/api/models/m/load", None, false),
    ];
    for (method, path, body, anthropic) in &cases {
        let what = format!("{method} {path}");
        assert_refused(&call(&gw, method, path, body.as_ref(), &[]), *anthropic, &format!("{what} without a key"));
        let r = call(&gw, method, path, body.as_ref(), &[("Authorization", &wrong)]);
        assert_refused(&r, *anthropic, &format!("{what} with the key in another case"));
        let r = call(&gw, method, path, body.as_ref(), &[("x-api-key", "sk-something-else")]);
        assert_refused(&r, *anthropic, &format!("{what} with another x-api-key"));
    }
    assert!(!gw.log().contains(KEY), "the key is never logged");

    // The right key, in each form.
    let bearer = format!("Bearer {KEY}");
    for h in [("Authorization", bearer.as_str()), ("x-api-key", KEY)] {
        let r = call(&gw, "POST", "/v1/chat/completions", Some(&chat()), &[h]);
        assert_eq!(r.status, 200, "{h:?}: {}", r.text());
        let r = call(&gw, "GET", "/engine", None, &[h]);
        assert_eq!(r.status, 200, "{h:?}");
        assert_eq!(r.json()["engines"][0]["state"], "ready");
        // The fake engine has no Messages route: past the key, its own 404 answers.
        let r = call(&gw, "POST", "/v1/messages", Some(&message()), &[h]);
        assert_eq!(r.status, 404, "{h:?}: {}", r.text());
    }

    // Open: the health check and the UI's files (the page asks for the key itself).
    for path in ["/health", "/", "/ui/app.js"] {
        assert_eq!(call(&gw, "GET", path, None, &[]).status, 200, "{path}");
    }
}

#[test]
fn anthropics_header_reaches_a_real_model() {
    let smol = format!("m={}", model_path(SMOLLM).display());
    let gw = Gateway::start(&["--model", &smol, "--threads", "1", "--api-key", KEY]);
    let r =
        call(&gw, "POST", "/v1/messages", Some(&message()), &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message");
    assert_refused(&call(&gw, "POST", "/v1/messages", Some(&message()), &[]), true, "no key");
}

#[test]
fn the_key_may_come_from_a_file_and_the_client_verbs_send_it() {
    let dir = TempDir::new("keyfile");
    let file = dir.path().join("key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let gw = fake_gateway(&[("m", json!({}))], &["--api-key-file", file.to_str().unwrap()]);
    let url = format!("http://{}", gw.addr);
    let out = run_corral(&["ps", "--url", &url, "--api-key", KEY], Duration::from_secs(30));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_corral(&["ps", "--url", &url], Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("API key"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_non_loopback_bind_needs_a_key_or_the_explicit_flag() {
    let dir = TempDir::new("exposed");
    let model = fake_model(dir.path(), "m", json!({}));
    let run = dir.path().join("run");
    let base = [
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--engine-bin",
        fake_engine_bin(),
        "--model",
        model.to_str().unwrap(),
        "--runtime-dir",
        run.to_str().unwrap(),
        "--no-ssd-cache",
    ];
    let out = run_corral(&base, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--api-key") && err.contains("--insecure-no-api-key"), "{err}");
    assert!(out.stdout.is_empty(), "it never listened: {}", String::from_utf8_lossy(&out.stdout));

    // With a key, or told explicitly, it starts.
    for extra in [&["--api-key", KEY][..], &["--insecure-no-api-key"][..]] {
        let mut args = vec!["--host", "0.0.0.0", "--engine-bin", fake_engine_bin(), "--model", model.to_str().unwrap()];
        args.extend_from_slice(extra);
        let gw = Gateway::start_in(TempDir::new("exposed-ok"), &args);
        assert!(gw.addr.starts_with("0.0.0.0:"), "{}", gw.addr);
        let port = gw.addr.rsplit(':').next().unwrap();
        let r = http::request(http::tcp(&format!("127.0.0.1:{port}")), "GET", "/health", None, &[]);
        assert_eq!(r.status, 200, "{extra:?}");
    }
}
