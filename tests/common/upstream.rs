//! Upstream-model tests' shared pieces: replicas (`corral serve` with SmolLM2 behind a
//! key), a front gateway from a config text, and calls with a bearer key.

#![allow(dead_code)]

use std::time::Duration;

use serde_json::{Value, json};

use super::gateway::{Gateway, wait_until};
use super::http::{self, Response, Sse};
use super::{GEMMA, SMOLLM, TempDir, model_path};

/// The front gateway's own key (clients use it).
pub const FRONT_KEY: &str = "sk-front-5c1f0a";
/// The replicas' key: the front gateway reads it from `KEY_VAR` and must never show it.
pub const CLUSTER_KEY: &str = "sk-cluster-93ad0c77e1";
pub const KEY_VAR: &str = "CORRAL_TEST_CLUSTER_KEY";

pub fn call(addr: &str, method: &str, path: &str, body: Option<&Value>, key: &str) -> Response {
    let auth = format!("Bearer {key}");
    let body = body.map(|b| b.to_string().into_bytes());
    http::request(http::tcp(addr), method, path, body.as_deref(), &[("authorization", &auth)])
}

pub fn stream(addr: &str, path: &str, body: &Value, key: &str) -> Sse {
    let auth = format!("Bearer {key}");
    Sse::open(http::tcp(addr), path, body.to_string().as_bytes(), &[("authorization", &auth)])
}

/// A replica: `corral serve` with SmolLM2 as `smol` (preloaded) and Gemma as `gemma`
/// (never loaded: it makes `smol` a name the replica needs), behind `CLUSTER_KEY`.
pub fn replica(port: Option<u16>) -> Gateway {
    let smol = format!("smol={}", model_path(SMOLLM).display());
    let gemma = format!("gemma={}", model_path(GEMMA).display());
    let port = port.map(|p| p.to_string());
    let mut args =
        vec!["--model", &smol, "--model", &gemma, "--threads", "1", "--preload", "smol", "--api-key", CLUSTER_KEY];
    if let Some(p) = &port {
        args.extend(["--port", p]);
    }
    let gw = Gateway::start(&args);
    let ready = wait_until(Duration::from_secs(60), || {
        let e = call(&gw.addr, "GET", "/engine", None, CLUSTER_KEY).json();
        e["engines"].as_array().unwrap().iter().any(|e| e["model"] == "smol" && e["state"] == "ready")
    });
    assert!(ready, "the replica's engine did not start: {}", gw.log());
    gw
}

/// A gateway with no local models, `config` as its config file, behind `FRONT_KEY`,
/// with the replicas' key in `KEY_VAR`.
pub fn front(config: &str, dir: TempDir) -> Gateway {
    front_env(config, dir, &[])
}

/// As `front`, with more environment variables.
pub fn front_env(config: &str, dir: TempDir, envs: &[(&str, &str)]) -> Gateway {
    let file = dir.path().join("corral.toml");
    std::fs::write(&file, config).unwrap();
    let none = dir.path().join("no-models");
    let (file, none) = (file.display().to_string(), none.display().to_string());
    let args = ["--config", &file, "--models-dir", &none, "--api-key", FRONT_KEY];
    let mut envs = envs.to_vec();
    envs.push((KEY_VAR, CLUSTER_KEY));
    Gateway::start_in_env(dir, &args, &envs)
}

pub fn chat(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Name three colors."}],
           "max_tokens": max_tokens, "temperature": 0})
}

/// What the front gateway's `/engine` shows of an upstream model (null if nothing).
pub fn upstream_of(front: &Gateway, model: &str) -> Value {
    let e = call(&front.addr, "GET", "/engine", None, FRONT_KEY).json();
    e["upstreams"].as_array().unwrap().iter().find(|u| u["model"] == model).cloned().unwrap_or(Value::Null)
}

/// The text of a streamed chat completion, checking it ended with `[DONE]`.
pub fn streamed_text(sse: &mut Sse) -> String {
    assert_eq!(sse.status, 200);
    let events = sse.collect();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}
