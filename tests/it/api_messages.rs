//! Anthropic Messages through `corral serve` with both real models: the message and
//! its event stream (the same answer), stop sequences, prompt-cache reuse in `usage`,
//! a tool round trip (streamed `input_json_delta` reassembles to the same input),
//! `count_tokens`, and errors in Anthropic's shape.

use crate::common::chat::*;
use crate::common::gateway::Gateway;
use serde_json::{Value, json};

fn ask(model: &str, text: &str, max_tokens: u32) -> Value {
    json!({"model": model, "max_tokens": max_tokens, "temperature": 0,
           "system": "Answer in one short sentence.",
           "messages": [{"role": "user", "content": text}]})
}

fn post(gw: &Gateway, path: &str, body: &Value) -> Value {
    let r = gw.post(path, body);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

/// The streamed events, in order, as (event name, data).
fn events(gw: &Gateway, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut sse = gw.stream("/v1/messages", &body);
    assert_eq!(sse.status, 200);
    sse.collect()
        .into_iter()
        .map(|data| {
            let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
            (v["type"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

/// A streamed message put back together: its content blocks and stop reason.
fn reassemble(events: &[(String, Value)]) -> (Vec<Value>, String) {
    let names: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    assert_eq!(names[names.len() - 2], "message_delta", "{names:?}");
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial = String::new();
    for (name, e) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(e["index"].as_u64().unwrap() as usize, blocks.len(), "blocks start in order");
                blocks.push(e["content_block"].clone());
                partial.clear();
            }
            "content_block_delta" => {
                let b = blocks.last_mut().unwrap();
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        b["text"] = json!(b["text"].as_str().unwrap().to_owned() + d["text"].as_str().unwrap())
                    }
                    "thinking_delta" => {
                        b["thinking"] =
                            json!(b["thinking"].as_str().unwrap().to_owned() + d["thinking"].as_str().unwrap())
                    }
                    "input_json_delta" => partial.push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let b = blocks.last_mut().unwrap();
                if b["type"] == "tool_use" {
                    b["input"] = serde_json::from_str(&partial).unwrap_or_else(|e| panic!("{e}: {partial}"));
                }
            }
            _ => {}
        }
    }
    let stop = events[events.len() - 2].1["delta"]["stop_reason"].as_str().unwrap().to_owned();
    (blocks, stop)
}

/// Ids differ between two answers; everything else must not.
fn without_ids(mut blocks: Vec<Value>) -> Vec<Value> {
    for b in &mut blocks {
        if let Some(o) = b.as_object_mut() {
            o.remove("id");
        }
    }
    blocks
}

#[test]
fn a_message_and_its_stream_carry_the_same_answer() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let body = ask(model, "What is the capital of France?", 24);
        let m = post(&gw, "/v1/messages", &body);
        assert_eq!((m["type"].as_str(), m["role"].as_str()), (Some("message"), Some("assistant")), "{m}");
        assert!(m["id"].as_str().unwrap().starts_with("msg_"));
        assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()), "{m}");
        let u = &m["usage"];
        assert!(u["input_tokens"].as_u64().unwrap() > 0 && u["output_tokens"].as_u64().unwrap() > 0, "{m}");
        let (blocks, stop) = reassemble(&events(&gw, &body));
        assert_eq!(without_ids(blocks), without_ids(m["content"].as_array().unwrap().clone()), "{model}");
        assert_eq!(stop, m["stop_reason"].as_str().unwrap());

        // The same prompt again: its prefix comes from the prompt cache.
        let again = post(&gw, "/v1/messages", &body);
        assert!(again["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{again}");

        // count_tokens: the prompt as rendered.
        let mut count = body.clone();
        count.as_object_mut().unwrap().remove("max_tokens");
        let n = post(&gw, "/v1/messages/count_tokens", &count)["input_tokens"].as_u64().unwrap();
        assert_eq!(n, u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap());
    }
}

#[test]
fn stop_sequences_report_which_one_stopped() {
    let gw = real_gateway(&[]);
    let mut body = ask("smol", "Count from one to ten in words, separated by commas.", 60);
    let first = post(&gw, "/v1/messages", &body)["content"][0]["text"].as_str().unwrap().to_owned();
    let word = first.split(|c: char| !c.is_alphabetic()).find(|w| w.len() > 3).expect("a word to stop at").to_owned();
    body["stop_sequences"] = json!([word.clone(), "never-appears"]);
    let m = post(&gw, "/v1/messages", &body);
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(word.as_str())),
        "{m}"
    );
    assert!(!m["content"][0]["text"].as_str().unwrap_or_default().contains(&word));
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Current weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                             "required": ["city"], "additionalProperties": false}}])
}

#[test]
fn tool_use_round_trip_on_both_models() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let mut body = ask(model, "What is the weather in Paris?", 60);
        body["tools"] = weather_tools();
        body["tool_choice"] = json!({"type": "any"});
        let m = post(&gw, "/v1/messages", &body);
        assert_eq!(m["stop_reason"], "tool_use", "{model}: {m}");
        let uses: Vec<&Value> = m["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), 1, "{m}");
        let tool_use = uses[0].clone();
        assert!(tool_use["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(tool_use["name"], "get_weather");
        assert_valid(&weather_tools()[0]["input_schema"], &tool_use["input"], model);

        let (blocks, stop) = reassemble(&events(&gw, &body));
        assert_eq!(stop, "tool_use");
        assert_eq!(without_ids(blocks), without_ids(m["content"].as_array().unwrap().clone()), "{model} streamed");

        // The result goes back in a user turn; the model answers in text.
        body["messages"] = json!([
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": m["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "18°C and sunny"}]}
        ]);
        body["tool_choice"] = json!({"type": "none"});
        let answer = post(&gw, "/v1/messages", &body);
        assert_ne!(answer["stop_reason"], "tool_use", "{answer}");
        assert!(answer["content"].as_array().unwrap().iter().all(|b| b["type"] != "tool_use"), "{answer}");
        assert!(answer["content"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{answer}");
    }
}

#[test]
fn bad_requests_are_anthropic_shaped_400s() {
    let gw = real_gateway(&[]);
    let cases = [
        (json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
        (
            json!({"model": "smol", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
            "image",
        ),
        (json!({"model": "smol", "max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}), "role"),
        (
            json!({"model": "smol", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "server tool",
        ),
        (
            json!({"model": "smol", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "maybe"}}),
            "thinking",
        ),
    ];
    for (body, needle) in cases {
        let r = gw.post("/v1/messages", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("invalid_request_error")),
            "{v}"
        );
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{needle}: {v}");
    }
    // Bad JSON and an unknown model: still Anthropic's shape (the gateway answers these).
    let r =
        crate::common::http::request(crate::common::http::tcp(&gw.addr), "POST", "/v1/messages", Some(b"{nope"), &[]);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    let r = gw.post(
        "/v1/messages",
        &json!({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "not_found_error");
}
