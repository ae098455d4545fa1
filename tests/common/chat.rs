//! Chat-completion helpers shared by the structured-output and tool tests: a gateway
//! over both real models, and a streamed answer put back together.

#![allow(dead_code)]

use serde_json::{Value, json};

use super::gateway::Gateway;
use super::{GEMMA, SMOLLM, TempDir, model_path};

/// The model ids of `real_gateway`.
pub const MODELS: [&str; 2] = ["smol", "gemma"];

/// `corral serve` over SmolLM2 as `smol` and Gemma 3 as `gemma`, both resident.
pub fn real_gateway(extra: &[&str]) -> Gateway {
    real_gateway_env(extra, &[])
}

pub fn real_gateway_env(extra: &[&str], envs: &[(&str, &str)]) -> Gateway {
    let a = format!("smol={}", model_path(SMOLLM).display());
    let b = format!("gemma={}", model_path(GEMMA).display());
    let mut args = vec!["--model", &a, "--model", &b, "--model-pool", "2", "--threads", "1"];
    args.extend_from_slice(extra);
    Gateway::start_in_env(TempDir::new("gateway"), &args, envs)
}

/// What a streamed chat completion adds up to, in the non-stream response's shape.
#[derive(Debug, PartialEq)]
pub struct Streamed {
    pub content: String,
    /// `[{"name", "arguments"}]` reassembled from `delta.tool_calls`.
    pub calls: Vec<Value>,
    pub finish_reason: String,
    pub warning: Option<String>,
}

pub fn stream_chat(gw: &Gateway, body: &Value) -> Streamed {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut sse = gw.stream("/v1/chat/completions", &body);
    assert_eq!(sse.status, 200);
    let warning = sse.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("warning")).map(|(_, v)| v.clone());
    let events = sse.collect();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let mut out = Streamed { content: String::new(), calls: Vec::new(), finish_reason: String::new(), warning };
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
        assert!(v.get("error").is_none(), "stream failed: {e}");
        let Some(choice) = v["choices"].get(0) else { continue };
        if let Some(c) = choice["delta"]["content"].as_str() {
            out.content.push_str(c);
        }
        for d in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == out.calls.len() {
                assert!(d["id"].as_str().is_some_and(|id| id.starts_with("call_")), "first delta has the id: {d}");
                assert_eq!(d["type"], "function");
                out.calls.push(json!({"name": d["function"]["name"], "arguments": ""}));
            }
            let args = out.calls[i]["arguments"].as_str().unwrap().to_owned()
                + d["function"]["arguments"].as_str().unwrap_or("");
            out.calls[i]["arguments"] = json!(args);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out.finish_reason = f.to_owned();
        }
    }
    out
}

/// The `{name, arguments}` of a non-stream response's tool calls.
pub fn calls_of(message: &Value) -> Vec<Value> {
    message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{c}");
            assert_eq!(c["type"], "function");
            json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        })
        .collect()
}

/// Validates `value` against `schema` (formats checked too), with a readable failure.
pub fn assert_valid(schema: &Value, value: &Value, what: &str) {
    let v = jsonschema::options().should_validate_formats(true).build(schema).expect("the test schema compiles");
    let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {value} does not validate: {errors:?}");
}
