//! gpt-oss's harmony format through `corral serve`, on a generated model whose
//! vocabulary is gpt-oss's (o200k_harmony) and which carries no chat template, so corral
//! renders its built-in harmony template: the prompt's layout and reasoning levels,
//! efforts harmony cannot honour refused on every API, tool calls and response formats
//! decoded under the harmony grammar and read back on all three APIs (the same text
//! gives the same calls and reasoning everywhere), reasoning split out of `analysis`.
//!
//! The model is make-gguf's `qwen2` preset with `--vocab o200k-harmony`, kept as
//! `<models dir>/generated/qwen2-o200k-harmony-q4_0.gguf` (made here when missing, from
//! scripts/models/vocab-o200k's vocabulary; without that the tests print `skipped:`
//! unless CORRAL_REQUIRE_GENERATED=1). Its weights are noise, so what it writes is steered
//! with the grammar and `logit_bias`: after `<|channel|>` the grammar allows `analysis`,
//! `commentary` (`comment` + `ary`) or `final`, and a bias on one of those tokens picks it.

use std::path::PathBuf;

use crate::common::chat::*;
use crate::common::gateway::Gateway;
use crate::common::generated::generated_model_with;
use serde_json::{Value, json};

/// o200k token ids (the vocabulary's fixed ranks): `analysis`, `comment`, `final`.
const ANALYSIS: &str = "35644";
const COMMENT: &str = "12606";
const FINAL: &str = "17196";
const MARKERS: [&str; 5] = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"];

fn model() -> Option<PathBuf> {
    generated_model_with("qwen2", Some("o200k-harmony"), "q4_0")
}

fn gateway() -> Option<Gateway> {
    let m = format!("oss={}", model()?.display());
    Some(Gateway::start(&["--model", &m, "--threads", "1"]))
}

fn city() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
           "additionalProperties": false})
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "oss", "temperature": 0, "max_tokens": 300,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": city()}}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn no_markers(text: &str, what: &str) {
    assert!(MARKERS.iter().all(|m| !text.contains(m)), "{what}: a harmony marker leaked: {text:?}");
}

#[test]
fn the_prompt_is_harmony_with_the_requested_reasoning_level() {
    let Some(gw) = gateway() else { return };
    let prompt = |extra: Value| {
        let r = gw.post("/apply-template", &chat(extra));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["prompt"].as_str().unwrap().to_owned()
    };
    let p = prompt(json!({}));
    assert!(p.starts_with("<|start|>system<|message|>You are ChatGPT"), "{p}");
    assert!(p.contains("Reasoning: medium\n\n"), "the default level: {p}");
    assert!(
        p.contains("namespace functions {\n\n// Current weather\ntype get_weather = (_: {\ncity: string,\n}) => any;"),
        "{p}"
    );
    assert!(p.ends_with("<|start|>user<|message|>What is the weather in Paris?<|end|><|start|>assistant"), "{p}");
    assert!(prompt(json!({"reasoning_effort": "high"})).contains("Reasoning: high\n\n"));
    let kwarg = prompt(json!({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}));
    assert!(kwarg.contains("Reasoning: low\n\n"), "an explicit template variable wins");
}

#[test]
fn an_effort_harmony_cannot_honour_is_a_400_on_every_api() {
    let Some(gw) = gateway() else { return };
    let r = gw.post("/v1/chat/completions", &chat(json!({"reasoning_effort": "none"})));
    assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("reasoning_effort")), "{}", r.text());
    let r = gw.post("/v1/responses", &json!({"model": "oss", "input": "Hi", "reasoning": {"effort": "minimal"}}));
    assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("reasoning.effort")), "{}", r.text());
    let r = gw.post(
        "/v1/messages",
        &json!({"model": "oss", "max_tokens": 10, "thinking": {"type": "disabled"},
                "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error", "Anthropic's error shape: {}", r.text());
    assert!(r.text().contains("thinking.type"), "{}", r.text());
    let low = gw.post(
        "/v1/messages",
        &json!({"model": "oss", "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(low.status, 200, "{}", low.text());
}

/// A required call, steered onto `commentary`: one call whose arguments validate, the
/// same when streamed; the call and its result render back in harmony's layout.
#[test]
fn a_required_call_is_a_valid_call_and_round_trips() {
    let Some(gw) = gateway() else { return };
    let body = chat(json!({"tool_choice": "required", "logit_bias": {COMMENT: 100}}));
    let r = gw.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let choice = r.json()["choices"][0].clone();
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let calls = calls_of(&choice["message"]);
    assert_eq!(calls.len(), 1, "{choice}");
    assert_eq!(calls[0]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert_valid(&city(), &args, "harmony call");
    let streamed = stream_chat(&gw, &body);
    assert_eq!((streamed.calls, streamed.finish_reason.as_str()), (calls.clone(), "tool_calls"));

    let mut message = choice["message"].clone();
    message["reasoning_content"] = json!("The user wants the weather.");
    let call_id = message["tool_calls"][0]["id"].clone();
    let history = json!([{"role": "user", "content": "What is the weather in Paris?"}, message,
        {"role": "tool", "tool_call_id": call_id, "content": "18C"}]);
    let r = gw.post("/apply-template", &chat(json!({"messages": history})));
    let p = r.json()["prompt"].as_str().unwrap().to_owned();
    let call = "<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": ";
    assert!(p.contains(call), "{call}\nnot in\n{p}");
    assert!(p.contains("\"}<|call|><|start|>functions.get_weather"), "{p}");
    assert!(p.ends_with("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18C\"<|end|><|start|>assistant"), "{p}");
}

/// Steered onto `analysis`: what the model writes there is reasoning, never content,
/// streamed or not.
#[test]
fn analysis_is_reasoning_content() {
    let Some(gw) = gateway() else { return };
    let body = chat(json!({"logit_bias": {ANALYSIS: 100}, "max_tokens": 24}));
    let m = gw.post("/v1/chat/completions", &body).json()["choices"][0]["message"].clone();
    let thought = m["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning: {m}")).to_owned();
    assert!(!thought.is_empty(), "{m}");
    no_markers(&thought, "reasoning");
    assert_eq!(m["content"].as_str().unwrap_or(""), "", "{m}");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = gw.stream("/v1/chat/completions", &stream).collect();
    let streamed: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, thought);
}

/// A response format applies to the `final` message's body.
#[test]
fn a_response_format_constrains_the_final_answer() {
    let Some(gw) = gateway() else { return };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "maximum": 9}}, "required": ["a"],
                        "additionalProperties": false});
    let body = chat(json!({"tools": null, "logit_bias": {FINAL: 100},
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}));
    let r = gw.post("/v1/chat/completions", &body);
    assert_eq!((r.status, r.header("warning")), (200, None), "{}", r.text());
    let content = r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert_valid(&schema, &serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content:?}")), "final");
}

/// One request, three APIs: the model writes the same text under the same grammar, so
/// each API reports the same calls and the same reasoning, in its own shape.
#[test]
fn every_api_reads_the_same_answer() {
    let Some(gw) = gateway() else { return };
    let q = "What is the weather in Paris?";
    let c = gw.post("/v1/chat/completions", &chat(json!({"tool_choice": "required"}))).json();
    let m = &c["choices"][0]["message"];
    let calls: Vec<(Value, Value)> = calls_of(m)
        .iter()
        .map(|c| (c["name"].clone(), serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap()))
        .collect();
    let thought = m["reasoning_content"].as_str().unwrap_or("").to_owned();
    assert!(!calls.is_empty() || !thought.is_empty(), "a call or reasoning (cut short): {c}");
    no_markers(&thought, "reasoning");

    let a = gw
        .post(
            "/v1/messages",
            &json!({"model": "oss", "max_tokens": 300, "temperature": 0, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": q}],
        "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": city()}]}),
        )
        .json();
    let blocks = a["content"].as_array().unwrap_or_else(|| panic!("{a}"));
    let a_calls: Vec<(Value, Value)> =
        blocks.iter().filter(|b| b["type"] == "tool_use").map(|b| (b["name"].clone(), b["input"].clone())).collect();
    let a_thought: String = blocks.iter().filter_map(|b| b["thinking"].as_str()).collect();
    assert_eq!((&a_calls, &a_thought), (&calls, &thought), "Anthropic: {a}");

    let r = gw.post("/v1/responses", &json!({"model": "oss", "max_output_tokens": 300, "temperature": 0, "input": q,
        "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "description": "Current weather", "parameters": city()}]})).json();
    let items = r["output"].as_array().unwrap_or_else(|| panic!("{r}"));
    let r_calls: Vec<(Value, Value)> = items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| (i["name"].clone(), serde_json::from_str(i["arguments"].as_str().unwrap()).unwrap()))
        .collect();
    let r_thought: String =
        items.iter().filter(|i| i["type"] == "reasoning").filter_map(|i| i["content"][0]["text"].as_str()).collect();
    assert_eq!((&r_calls, &r_thought), (&calls, &thought), "Responses: {r}");
}
