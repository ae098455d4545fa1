//! OpenAI Responses through `corral serve` with both real models: the response object
//! and its numbered event stream (the same output), structured output via
//! `text.format`, a function-calling round trip (calls and their outputs as input
//! items), and errors in OpenAI's shape.

use crate::common::chat::*;
use crate::common::gateway::Gateway;
use serde_json::{Value, json};

fn post(gw: &Gateway, body: &Value) -> Value {
    let r = gw.post("/v1/responses", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The streamed events' data, in order; checks the numbering and the envelope.
fn events(gw: &Gateway, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut sse = gw.stream("/v1/responses", &body);
    assert_eq!(sse.status, 200);
    let events: Vec<Value> = sse.collect().iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"].as_u64(), Some(i as u64), "{e}");
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..2], ["response.created", "response.in_progress"], "{types:?}");
    assert!(["response.completed", "response.incomplete"].contains(types.last().unwrap()), "{types:?}");
    events
}

/// What the deltas add up to: (text, [(name, arguments)]).
fn from_deltas(events: &[Value]) -> (String, Vec<(String, String)>) {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e["type"].as_str().unwrap() {
            "response.output_text.delta" => text.push_str(e["delta"].as_str().unwrap()),
            "response.output_item.added" if e["item"]["type"] == "function_call" => {
                calls.push((e["item"]["name"].as_str().unwrap().to_owned(), String::new()))
            }
            "response.function_call_arguments.delta" => {
                calls.last_mut().unwrap().1.push_str(e["delta"].as_str().unwrap())
            }
            _ => {}
        }
    }
    (text, calls)
}

fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect()
}

#[test]
fn a_response_and_its_stream_carry_the_same_output() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        let body = json!({"model": model, "input": "What is the capital of France?", "instructions": "Answer in one short sentence.",
                          "max_output_tokens": 24, "temperature": 0, "metadata": {"k": "v"}});
        let r = post(&gw, &body);
        assert_eq!((r["object"].as_str(), r["model"].as_str()), (Some("response"), Some(model)), "{r}");
        assert!(r["id"].as_str().unwrap().starts_with("resp_"));
        assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()), "{r}");
        assert_eq!(
            (r["metadata"]["k"].as_str(), r["instructions"].as_str()),
            (Some("v"), Some("Answer in one short sentence."))
        );
        let u = &r["usage"];
        assert_eq!(
            u["total_tokens"].as_u64(),
            Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
        );
        let text = output_text(&r);
        assert!(!text.is_empty(), "{r}");

        let ev = events(&gw, &body);
        assert_eq!(from_deltas(&ev).0, text, "{model}: deltas");
        let last = &ev.last().unwrap()["response"];
        assert_eq!(output_text(last), text, "{model}: the final event's response");
        assert!(
            last["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0,
            "the second run hits the prompt cache"
        );
    }
}

#[test]
fn text_format_json_schema_is_enforced() {
    let gw = real_gateway(&[]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
                        "required": ["city", "country"], "additionalProperties": false});
    for model in MODELS {
        let body = json!({"model": model, "input": "Name a big city and its country.", "instructions": "Reply with a short JSON value.",
                          "temperature": 0, "max_output_tokens": 80,
                          "text": {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": true}}});
        let r = post(&gw, &body);
        let v: Value = serde_json::from_str(&output_text(&r)).unwrap_or_else(|e| panic!("{model}: {e}: {r}"));
        assert_valid(&schema, &v, model);
        assert_eq!(from_deltas(&events(&gw, &body)).0, output_text(&r), "{model} streamed");
    }
}

#[test]
fn function_calling_round_trip_on_both_models() {
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Current weather for a city",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                                       "required": ["city"], "additionalProperties": false}}]);
    let gw = real_gateway(&[]);
    for model in MODELS {
        let body = json!({"model": model, "input": "What is the weather in Paris?", "tools": tools, "tool_choice": "required",
                          "temperature": 0, "max_output_tokens": 60});
        let r = post(&gw, &body);
        let calls: Vec<&Value> =
            r["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect();
        assert_eq!(calls.len(), 1, "{r}");
        let call = calls[0].clone();
        assert_eq!(call["name"], "get_weather");
        assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_valid(&tools[0]["parameters"], &args, model);
        assert_eq!(
            from_deltas(&events(&gw, &body)).1,
            vec![("get_weather".to_owned(), call["arguments"].as_str().unwrap().to_owned())]
        );

        let follow = json!({"model": model, "tools": tools, "tool_choice": "none", "temperature": 0, "max_output_tokens": 40,
                            "input": [{"role": "user", "content": "What is the weather in Paris?"}, call,
                                      {"type": "function_call_output", "call_id": call["call_id"], "output": "18°C and sunny"}]});
        let answer = post(&gw, &follow);
        assert!(answer["output"].as_array().unwrap().iter().all(|i| i["type"] != "function_call"), "{answer}");
        assert!(!output_text(&answer).is_empty(), "{answer}");
    }
}

#[test]
fn bad_requests_are_openai_shaped_400s() {
    let gw = real_gateway(&[]);
    let cases = [
        (json!({"model": "smol"}), "input"),
        (json!({"model": "smol", "input": "hi", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
        (json!({"model": "smol", "input": "hi", "tools": [{"type": "web_search"}]}), "tools[0].type"),
        (
            json!({"model": "smol", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"model": "smol", "input": "hi", "reasoning": {"effort": "extreme"}}), "reasoning.effort"),
    ];
    for (body, param) in cases {
        let r = gw.post("/v1/responses", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
}
