//! Tool calling through `corral serve` with both real models (whose templates have no
//! tool syntax, so corral's fallback prompt and call syntax are used): `required`,
//! named, `auto` and `none`, each as a round trip (call → tool result → answer);
//! streamed `delta.tool_calls` reassemble to the non-stream call; bad tool requests
//! are 400s naming the field.

use crate::common::chat::*;
use crate::common::gateway::Gateway;
use serde_json::{Value, json};

fn tools() -> Value {
    let city = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                      "required": ["city"], "additionalProperties": false});
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": city}},
        {"type": "function", "function": {"name": "get_time", "description": "Current local time in a city", "parameters": city}}
    ])
}

fn request(model: &str, messages: &Value, choice: Value) -> Value {
    json!({"model": model, "messages": messages, "tools": tools(), "tool_choice": choice,
           "temperature": 0, "max_tokens": 60})
}

fn question() -> Value {
    json!([{"role": "user", "content": "What is the weather in Paris?"}])
}

fn parameters(name: &str) -> Value {
    tools().as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap()["function"]["parameters"]
        .clone()
}

/// One call: its name is `want` (if given) and its arguments validate. The stream
/// carries the same call. Returns the assistant message.
fn expect_call(gw: &Gateway, body: &Value, want: Option<&str>, what: &str) -> Value {
    let r = gw.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    let choice = r.json()["choices"][0].clone();
    assert_eq!(choice["finish_reason"], "tool_calls", "{what}: {choice}");
    let message = choice["message"].clone();
    let calls = calls_of(&message);
    assert_eq!(calls.len(), 1, "{what}: one call unless parallel_tool_calls: {message}");
    let name = calls[0]["name"].as_str().unwrap();
    if let Some(w) = want {
        assert_eq!(name, w, "{what}");
    }
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert_valid(&parameters(name), &args, what);
    let streamed = stream_chat(gw, body);
    assert_eq!(streamed.calls, calls, "{what}: streamed deltas reassemble to the same call");
    assert_eq!(streamed.finish_reason, "tool_calls", "{what}");
    message
}

/// The follow-up after a call: history with the call and its result renders (both
/// visible in the prompt) and the model answers under `choice`.
fn round_trip(gw: &Gateway, model: &str, call_message: &Value, choice: Value, what: &str) {
    let mut messages = question().as_array().unwrap().clone();
    messages.push(call_message.clone());
    let id = call_message["tool_calls"][0]["id"].clone();
    messages
        .push(json!({"role": "tool", "tool_call_id": id, "content": "{\"temperature_c\": 18, \"sky\": \"sunny\"}"}));
    let body = request(model, &json!(messages), choice.clone());

    let r = gw.post("/apply-template", &body);
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    let prompt = r.json()["prompt"].as_str().unwrap().to_owned();
    let name = call_message["tool_calls"][0]["function"]["name"].as_str().unwrap();
    assert!(prompt.contains(&format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": ")), "{what}: {prompt}");
    assert!(
        prompt.contains("<tool_response>\n{\"temperature_c\": 18, \"sky\": \"sunny\"}\n</tool_response>"),
        "{what}: {prompt}"
    );

    let r = gw.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    let c = r.json()["choices"][0].clone();
    let calls = calls_of(&c["message"]);
    if choice == "none" || calls.is_empty() {
        assert!(calls.is_empty(), "{what}: {c}");
        assert!(c["message"]["content"].as_str().is_some_and(|t| !t.is_empty()), "{what}: an answer: {c}");
    } else {
        let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
        assert_valid(&parameters(calls[0]["name"].as_str().unwrap()), &args, what);
    }
}

#[test]
fn required_and_named_calls_round_trip_on_both_models() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let m = expect_call(&gw, &request(model, &question(), json!("required")), None, &format!("{model} required"));
        assert!(m["content"].is_null(), "{m}");
        round_trip(&gw, model, &m, json!("auto"), &format!("{model} required → auto"));

        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let m = expect_call(&gw, &request(model, &question(), named), Some("get_time"), &format!("{model} named"));
        round_trip(&gw, model, &m, json!("none"), &format!("{model} named → none"));
    }
}

#[test]
fn auto_lets_the_model_choose_and_none_never_calls() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let what = format!("{model} auto");
        let body = request(model, &question(), json!("auto"));
        let r = gw.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let c = r.json()["choices"][0].clone();
        let calls = calls_of(&c["message"]);
        let streamed = stream_chat(&gw, &body);
        assert_eq!(streamed.calls, calls, "{what}");
        if calls.is_empty() {
            assert_eq!(streamed.content, c["message"]["content"].as_str().unwrap(), "{what}");
        } else {
            let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
            assert_valid(&parameters(calls[0]["name"].as_str().unwrap()), &args, &what);
            assert_eq!(c["finish_reason"], "tool_calls");
            round_trip(&gw, model, &c["message"], json!("auto"), &format!("{what} → auto"));
        }

        // none: no call, and the tools are not offered in the prompt.
        let body = request(model, &question(), json!("none"));
        let r = gw.post("/v1/chat/completions", &body);
        let c = r.json()["choices"][0].clone();
        assert!(c["message"]["tool_calls"].is_null() && c["message"]["content"].is_string(), "{model} none: {c}");
        assert_ne!(c["finish_reason"], "tool_calls");
        let prompt = gw.post("/apply-template", &body).json()["prompt"].as_str().unwrap().to_owned();
        assert!(!prompt.contains("get_weather"), "{prompt}");
    }
}

#[test]
fn the_fallback_prompt_lists_the_tools_and_the_syntax() {
    let gw = real_gateway(&[]);
    let r = gw.post("/apply-template", &request("gemma", &question(), json!("required")));
    let prompt = r.json()["prompt"].as_str().unwrap().to_owned();
    assert!(prompt.starts_with("<start_of_turn>user\nYou can call functions (tools)."), "{prompt}");
    assert!(prompt.contains("\"name\":\"get_weather\"") && prompt.contains("Current local time in a city"), "{prompt}");
    assert!(prompt.contains("You must call at least one function now."), "{prompt}");
    assert!(prompt.ends_with("What is the weather in Paris?<end_of_turn>\n<start_of_turn>model\n"), "{prompt}");
}

#[test]
fn bad_tool_requests_are_400s_naming_the_field() {
    let gw = real_gateway(&[]);
    let cases = [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}), "tools[0].function.name"),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tools": tools(), "tool_choice": "maybe"}), "tool_choice"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": "smol", "messages": question(), "max_tokens": 5});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = gw.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    let bad_history = json!({"model": "smol", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]});
    let r = gw.post("/v1/chat/completions", &bad_history);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "messages[0].tool_calls[0].function.arguments");
}
