//! Stored Responses through `corral serve`: `previous_response_id` continues a
//! conversation after its engine was evicted for another model (`--model-pool 1`) and
//! after a gateway restart; the continuation is exactly the request with the history
//! written out; `store: false`, `GET` and `DELETE /v1/responses/{id}`, and unknown ids
//! as OpenAI-shaped 404s. Also `/v1/models` as the header reader fills it.

use std::time::Duration;

use crate::common::chat::MODELS;
use crate::common::gateway::Gateway;
use crate::common::{GEMMA, SMOLLM, TempDir, model_path};
use serde_json::{Value, json};

fn start(dir: &TempDir, pool: &str) -> Gateway {
    let a = format!("smol={}", model_path(SMOLLM).display());
    let b = format!("gemma={}", model_path(GEMMA).display());
    let responses = dir.path().join("responses");
    let args = ["--model", &a, "--model", &b, "--model-pool", pool, "--threads", "1", "--no-ssd-cache"];
    let mut args: Vec<&str> = args.to_vec();
    let r = responses.to_str().unwrap().to_owned();
    args.extend(["--responses-dir", &r]);
    Gateway::start(&args)
}

fn create(gw: &Gateway, body: &Value) -> Value {
    let r = gw.post("/v1/responses", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The final event's response of a streamed request.
fn create_streamed(gw: &Gateway, body: &Value) -> Value {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut sse = gw.stream("/v1/responses", &body);
    assert_eq!(sse.status, 200);
    let last: Value = serde_json::from_str(sse.collect().last().unwrap()).unwrap();
    last["response"].clone()
}

fn text(r: &Value) -> String {
    let out = r["output"].as_array().unwrap();
    out.iter().filter(|i| i["type"] == "message").map(|i| i["content"][0]["text"].as_str().unwrap()).collect()
}

fn ask(model: &str, input: Value) -> Value {
    json!({"model": model, "input": input, "max_output_tokens": 12, "temperature": 0})
}

/// A continuation must be the same request as the one with the history written out.
fn assert_same_as_explicit(gw: &Gateway, model: &str, first: &Value, next: &Value, input: &str) {
    let mut items = vec![json!({"role": "user", "content": "My name is Ada."})];
    items.extend(first["output"].as_array().unwrap().iter().cloned());
    items.push(json!({"role": "user", "content": input}));
    let explicit =
        create(gw, &json!({"model": model, "input": items, "max_output_tokens": 12, "temperature": 0, "store": false}));
    assert_eq!(next["usage"]["input_tokens"], explicit["usage"]["input_tokens"], "{model}: {next}");
    assert_eq!(text(next), text(&explicit), "{model}");
}

#[test]
fn a_conversation_continues_after_its_engine_was_evicted_for_another_model() {
    let dir = TempDir::new("stored");
    let gw = start(&dir, "1");
    for (model, other) in [("smol", "gemma"), ("gemma", "smol")] {
        let first = create(&gw, &ask(model, json!("My name is Ada.")));
        // The other model takes the only slot: this model's engine is stopped.
        assert_eq!(
            gw.post(
                "/v1/chat/completions",
                &json!({"model": other, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]})
            )
            .status,
            200
        );
        assert_eq!(gw.engine()["pool"]["resident"], json!([other]));

        let mut body = ask(model, json!("What is my name?"));
        body["previous_response_id"] = first["id"].clone();
        let next = create(&gw, &body);
        assert_eq!(next["previous_response_id"], first["id"]);
        assert_same_as_explicit(&gw, model, &first, &next, "What is my name?");

        // A streamed continuation is stored too, and continues in turn.
        body["previous_response_id"] = next["id"].clone();
        let streamed = create_streamed(&gw, &body);
        let got = gw.get(&format!("/v1/responses/{}", streamed["id"].as_str().unwrap()));
        assert_eq!(got.status, 200, "{}", got.text());
        assert_eq!(got.json()["output"], streamed["output"]);
        let mut third = ask(model, json!("Thanks."));
        third["previous_response_id"] = streamed["id"].clone();
        let r = create(&gw, &third);
        assert!(
            r["usage"]["input_tokens"].as_u64() > next["usage"]["input_tokens"].as_u64(),
            "three turns of history: {r}"
        );
    }
}

#[test]
fn a_conversation_survives_a_gateway_restart() {
    let dir = TempDir::new("stored-restart");
    let first: Vec<Value> = {
        let mut gw = start(&dir, "2");
        let first = MODELS.iter().map(|m| create(&gw, &ask(m, json!("My name is Ada.")))).collect();
        gw.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(gw.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", gw.log());
        first
    };
    let gw = start(&dir, "2");
    for (model, first) in MODELS.iter().zip(&first) {
        let mut body = ask(model, json!("What is my name?"));
        body["previous_response_id"] = first["id"].clone();
        let next = create(&gw, &body);
        assert_same_as_explicit(&gw, model, first, &next, "What is my name?");
    }
}

#[test]
fn store_false_get_delete_and_unknown_ids() {
    let dir = TempDir::new("stored-ids");
    let gw = start(&dir, "2");
    let kept = create(&gw, &ask("smol", json!("hello")));
    let id = kept["id"].as_str().unwrap();
    let got = gw.get(&format!("/v1/responses/{id}"));
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), kept, "retrieved as it was answered");

    let mut unstored = ask("smol", json!("hello"));
    unstored["store"] = json!(false);
    let unstored = create(&gw, &unstored);
    assert_eq!(unstored["store"], false);
    assert_eq!(gw.get(&format!("/v1/responses/{}", unstored["id"].as_str().unwrap())).status, 404);

    let del = crate::common::http::request(
        crate::common::http::tcp(&gw.addr),
        "DELETE",
        &format!("/v1/responses/{id}"),
        None,
        &[],
    );
    assert_eq!(del.status, 200, "{}", del.text());
    assert_eq!(del.json(), json!({"id": id, "object": "response", "deleted": true}));
    let again = gw.get(&format!("/v1/responses/{id}"));
    assert_eq!(again.status, 404);
    assert_eq!(again.json()["error"]["type"], "invalid_request_error", "OpenAI's shape");

    let mut body = ask("smol", json!("What is my name?"));
    body["previous_response_id"] = json!(id);
    let r = gw.post("/v1/responses", &body);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
    assert_eq!(gw.get("/v1/responses/../../etc/passwd").status, 404);
    assert_eq!(gw.post("/v1/responses/resp_1", &json!({})).status, 405);
}

#[test]
fn models_are_described_from_their_headers_before_any_engine_runs() {
    let dir = TempDir::new("stored-models");
    let gw = start(&dir, "1");
    let models = gw.get("/v1/models").json();
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["smol", "gemma"], "the order given; the first is the default");
    for m in data {
        assert_eq!((m["resident"].as_bool(), m["context_window"].as_u64()), (Some(false), Some(4096)), "{m}");
        let caps = &m["capabilities"];
        for yes in ["chat_completions", "text_completions", "anthropic_messages", "responses", "streaming", "tools"] {
            assert_eq!(caps[yes], true, "{yes}: {m}");
        }
        for no in ["vision", "audio", "embeddings"] {
            assert_eq!(caps[no], false, "{no}: {m}");
        }
        assert_eq!(
            (m["tools"].as_bool(), m["structured_output"].as_bool(), m["vision"].as_bool()),
            (Some(true), Some(true), Some(false))
        );
    }
    assert_eq!(gw.counter("spawns"), 0, "no engine was started to answer");
    // Once an engine has run, its own card is the same on every field the header gave.
    assert_eq!(gw.post("/v1/completions", &json!({"model": "smol", "prompt": "a", "max_tokens": 1})).status, 200);
    let after = gw.get("/v1/models").json();
    for k in ["context_window", "capabilities", "tools", "structured_output", "arch", "chat_template"] {
        assert_eq!(after["data"][0][k], data[0][k], "{k}");
    }
}
