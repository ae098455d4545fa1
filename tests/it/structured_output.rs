//! Structured output through `corral serve` with both real models: every schema in
//! `fixtures/schemas.json`, streamed and not, parses and validates; json_object,
//! regex, choice and Lark grammars hold; a second constraint is a 400; a constraint
//! that cannot be enforced degrades visibly (Warning header, instruction in the prompt).

use crate::common::chat::*;
use crate::common::gateway::Gateway;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};

const SYSTEM: &str = "Reply with a short JSON value.";

fn schemas() -> Vec<Value> {
    let v: Value = serde_json::from_str(include_str!("../fixtures/schemas.json")).unwrap();
    v.as_array().unwrap().clone()
}

fn ask(model: &str, system: &str, prompt: &str, max_tokens: u32) -> Value {
    json!({"model": model, "temperature": 0, "max_tokens": max_tokens,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]})
}

fn answer(gw: &Gateway, body: &Value) -> (Value, Option<String>) {
    let r = gw.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let warning = r.header("warning").map(str::to_owned);
    (r.json()["choices"][0].clone(), warning)
}

/// One schema on one model: the answer parses, validates and stops; the stream carries
/// the same answer (greedy decoding).
fn schema_is_followed(gw: &Gateway, model: &str, s: &Value) {
    let (name, schema) = (s["name"].as_str().unwrap(), &s["schema"]);
    let mut body = ask(model, SYSTEM, s["prompt"].as_str().unwrap(), 200);
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": true}});
    let (choice, warning) = answer(gw, &body);
    let what = format!("{model}/{name}");
    assert_eq!(warning, None, "{what}");
    assert_eq!(choice["finish_reason"], "stop", "{what}: {choice}");
    let text = choice["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    assert_valid(schema, &value, &what);
    let streamed = stream_chat(gw, &body);
    assert_eq!((streamed.content.as_str(), streamed.finish_reason.as_str()), (text, "stop"), "{what} streamed");
}

#[test]
fn every_schema_is_followed_by_both_models_streamed_or_not() {
    let gw = real_gateway(&[]);
    let schemas = schemas();
    assert!(schemas.len() >= 25);
    // Both engines at once, several requests in flight on each: they decode as rows of
    // one batch, and the default arithmetic is batch-invariant, so every answer is the
    // one the request would get alone (and each grammar is enforced per row).
    let jobs: Vec<(&str, &Value)> = schemas.iter().flat_map(|s| MODELS.map(|m| (m, s))).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..12 {
            scope.spawn(|| {
                while let Some(&(model, s)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    schema_is_followed(&gw, model, s);
                }
            });
        }
    });
}

#[test]
fn json_object_regex_choice_and_lark_hold_on_every_field_and_route() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        // json_object, via OpenAI's field.
        let mut b = ask(model, SYSTEM, "What is 2+2? Answer as JSON with a key answer.", 200);
        b["response_format"] = json!({"type": "json_object"});
        let (c, _) = answer(&gw, &b);
        let v: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap();
        assert!(v.is_object(), "{model}: {v}");

        // regex, via vLLM's field; streamed too.
        let mut b = ask(model, "Answer briefly.", "What time is it? Use HH:MM.", 20);
        b["guided_regex"] = json!("[0-2][0-9]:[0-5][0-9]");
        let (c, _) = answer(&gw, &b);
        let t = c["message"]["content"].as_str().unwrap().to_owned();
        assert!(
            t.len() == 5 && t.as_bytes()[2] == b':' && t.bytes().filter(u8::is_ascii_digit).count() == 4,
            "{model}: {t:?}"
        );
        assert_eq!(c["finish_reason"], "stop");
        assert_eq!(stream_chat(&gw, &b).content, t);

        // choice, via the newer structured_outputs.
        let mut b = ask(model, "Answer briefly.", "Is the sea salty?", 10);
        b["structured_outputs"] = json!({"choice": ["yes, it is", "no"]});
        let (c, _) = answer(&gw, &b);
        assert!(["yes, it is", "no"].contains(&c["message"]["content"].as_str().unwrap()), "{model}: {c}");

        // A Lark grammar: a tiny arithmetic language.
        let lark = "start: expr\nexpr: NUM (OP NUM){1,3}\nNUM: /[0-9]{1,3}/\nOP: \" + \" | \" - \"\n";
        let mut b = ask(model, "Answer briefly.", "Write a sum of two numbers.", 30);
        b["guided_grammar"] = json!(lark);
        let (c, _) = answer(&gw, &b);
        let t = c["message"]["content"].as_str().unwrap();
        let parts: Vec<&str> = t.split(' ').collect();
        assert!(parts.len() >= 3 && parts.len() % 2 == 1, "{model}: {t:?}");
        for (i, p) in parts.iter().enumerate() {
            let ok = if i % 2 == 0 {
                !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit())
            } else {
                *p == "+" || *p == "-"
            };
            assert!(ok, "{model}: {t:?}");
        }

        // Raw completions take the same fields.
        let body = json!({"model": model, "prompt": "The capital of France is", "max_tokens": 40, "temperature": 0,
                          "guided_json": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": false}});
        let r = gw.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_owned();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{model}: {e}: {text}"));
        assert!(v["city"].is_string(), "{v}");
    }
}

#[test]
fn two_constraints_are_a_400_naming_both() {
    let gw = real_gateway(&[]);
    let mut b = ask("smol", SYSTEM, "Hi", 5);
    b["response_format"] = json!({"type": "json_object"});
    b["guided_regex"] = json!("a+");
    let r = gw.post("/v1/chat/completions", &b);
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("response_format") && msg.contains("guided_regex"), "{msg}");
    // A bad type is a 400 too, never ignored.
    let mut b = ask("smol", SYSTEM, "Hi", 5);
    b["response_format"] = json!({"type": "yaml"});
    let r = gw.post("/v1/chat/completions", &b);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "response_format");
}

/// `oneOf` is a schema feature llguidance does not compile.
fn one_of_request(model: &str) -> Value {
    let mut b = ask(model, "Answer briefly.", "Name a pet.", 30);
    b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "pet", "schema":
        {"oneOf": [{"type": "object", "properties": {"cat": {"type": "string"}}, "required": ["cat"]},
                   {"type": "object", "properties": {"dog": {"type": "string"}}, "required": ["dog"]}]}}});
    b
}

fn assert_degraded(gw: &Gateway, body: &Value, reason: &str) {
    let (c, warning) = answer(gw, body);
    let w = warning.unwrap_or_else(|| panic!("no Warning header: {c}"));
    assert!(w.starts_with("299 - \"grammar not enforced: ") && w.contains(reason), "{w}");
    assert!(stream_chat(gw, body).warning.is_some_and(|s| s == w), "the stream carries the header too");
    // The instruction, with the schema verbatim, is in the rendered prompt.
    let r = gw.post("/apply-template", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt = r.json()["prompt"].as_str().unwrap().to_owned();
    let schema = serde_json::to_string(&body["response_format"]["json_schema"]["schema"]).unwrap();
    assert!(prompt.contains("conforms to this JSON Schema") && prompt.contains(&schema), "{prompt}");
}

#[test]
fn a_schema_that_does_not_compile_degrades_visibly() {
    let gw = real_gateway(&[]);
    for model in MODELS {
        assert_degraded(&gw, &one_of_request(model), "oneOf");
    }
    // Raw completions: the header only.
    let body = json!({"model": "smol", "prompt": "A pet:", "max_tokens": 5, "guided_json": one_of_request("smol")["response_format"]["json_schema"]["schema"]});
    let r = gw.post("/v1/completions", &body);
    assert_eq!(r.status, 200);
    assert!(r.header("warning").is_some_and(|w| w.contains("oneOf")));
}

#[test]
fn grammar_off_degrades_every_constraint_visibly() {
    let gw = real_gateway_env(&[], &[("CORRAL_GRAMMAR", "0")]);
    let mut b = ask("gemma", SYSTEM, "Describe a person.", 30);
    b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}});
    assert_degraded(&gw, &b, "--grammar off");
}
