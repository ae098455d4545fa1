//! `docs/openapi.yaml` kept true. The routes it lists are exactly the gateway's route
//! table (path and method), its bounds are `protocol::bounds`' constants, and a real
//! `corral serve` over both test models answers a request to every operation — its
//! successes and its typical errors (bad JSON, unknown model, missing field, a value
//! over a bound, a missing or wrong key, a cross-site POST, an oversized body) — with a
//! status the spec lists for that operation, a media type it lists for that status, and
//! a body (or, for a stream, every event) valid under the schema it gives. The requests
//! that succeed are valid under the spec's request schema, and those over a bound are not.

mod spec;

use std::collections::BTreeSet;

use crate::common::gateway::Gateway;
use crate::common::http::{self, Response};
use crate::common::{GEMMA, SMOLLM, model_path};
use serde_json::{Value, json};
use spec::{Spec, bare_media, sse_events};

const KEY: &str = "sk-openapi-test-3b9e1c7d";
/// `--max-body-bytes` for this server: small enough to cross cheaply.
const MAX_BODY: usize = 200_000;

#[test]
fn the_spec_lists_exactly_the_gateways_routes() {
    let spec = Spec::load();
    let served: BTreeSet<(String, String)> = corral_gateway::routes::ALL
        .into_iter()
        .flat_map(|r| r.methods().map(move |m| (m.to_owned(), r.path().to_owned())))
        .collect();
    let listed = spec.operations();
    assert_eq!(
        listed,
        served,
        "only in the spec: {:?}; only served: {:?}",
        listed.difference(&served).collect::<Vec<_>>(),
        served.difference(&listed).collect::<Vec<_>>()
    );
    assert_eq!(spec.dangling_refs(), Vec::<String>::new(), "every $ref resolves");
    assert!(spec.doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")));
}

#[test]
fn the_specs_bounds_are_the_servers() {
    use corral_protocol::bounds::{MAX_OUTPUT_TOKENS, MAX_STOP_BYTES, MAX_STOPS};
    let spec = Spec::load();
    let s = &spec.doc["components"]["schemas"];
    assert_eq!(s["MaxTokens"]["maximum"], json!(MAX_OUTPUT_TOKENS));
    assert_eq!(s["MaxTokens"]["minimum"], json!(1));
    let stop = &s["Stop"]["oneOf"];
    assert_eq!(stop[0]["maxLength"], json!(MAX_STOP_BYTES));
    assert_eq!(stop[1]["maxItems"], json!(MAX_STOPS));
    assert_eq!(stop[1]["items"]["maxLength"], json!(MAX_STOP_BYTES));
    let seq = &s["MessagesRequest"]["allOf"][1]["properties"]["stop_sequences"];
    assert_eq!((&seq["maxItems"], &seq["items"]["maxLength"]), (&json!(MAX_STOPS), &json!(MAX_STOP_BYTES)));
    // Open routes are the ones the gateway lets through without a key.
    for r in corral_gateway::routes::ALL {
        for m in r.methods() {
            let op = &spec.doc["paths"][r.path()][m.to_ascii_lowercase()];
            let open = op.get("security") == Some(&json!([]));
            assert_eq!(open, !r.needs_key(), "{m} {}: security", r.path());
        }
    }
}

/// One request and the status it must get.
struct Case {
    method: &'static str,
    /// The spec's path (template).
    op: &'static str,
    path: String,
    body: Option<Vec<u8>>,
    headers: Vec<(&'static str, String)>,
    status: u16,
    /// Whether the body must be valid (or invalid) under the spec's request schema.
    request_valid: Option<bool>,
}

impl Case {
    fn new(method: &'static str, op: &'static str, status: u16) -> Self {
        let headers = vec![("Authorization", format!("Bearer {KEY}"))];
        Self { method, op, path: op.to_owned(), body: None, headers, status, request_valid: None }
    }
    fn get(op: &'static str, status: u16) -> Self {
        Self::new("GET", op, status)
    }
    /// A JSON body; a successful request's body must be valid under the spec.
    fn post(op: &'static str, body: Value, status: u16) -> Self {
        let valid = (200..300).contains(&status).then_some(true);
        Self { body: Some(body.to_string().into_bytes()), request_valid: valid, ..Self::new("POST", op, status) }
    }
    fn raw(mut self, body: &[u8]) -> Self {
        self.body = Some(body.to_vec());
        self.request_valid = None;
        self
    }
    fn at(mut self, path: &str) -> Self {
        self.path = path.to_owned();
        self
    }
    /// Over a bound or missing a required field: invalid under the spec too.
    fn invalid(mut self) -> Self {
        self.request_valid = Some(false);
        self
    }
    fn key(mut self, header: &'static str, value: Option<&str>) -> Self {
        self.headers.retain(|(k, _)| *k != "Authorization");
        if let Some(v) = value {
            self.headers.push((header, v.to_owned()));
        }
        self
    }
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }
}

struct Run {
    spec: Spec,
    gw: Gateway,
    /// Operations that answered, and those that answered with a success.
    seen: BTreeSet<(String, String)>,
    succeeded: BTreeSet<(String, String)>,
}

impl Run {
    /// Send `c` and check its answer against the spec; the answer is returned.
    fn check(&mut self, c: Case) -> Response {
        let what = format!("{} {} -> {}", c.method, c.path, c.status);
        if let (Some(want), Some(body)) = (c.request_valid, &c.body) {
            let schema =
                self.spec.request_schema(c.method, c.op).unwrap_or_else(|| panic!("{what}: no request schema"));
            let body: Value = serde_json::from_slice(body).unwrap();
            let errors = self.spec.errors(&schema, &body);
            assert_eq!(errors.is_empty(), want, "{what}: request body valid under the spec? {errors:?}");
        }
        let headers: Vec<(&str, &str)> = c.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = http::request(http::tcp(&self.gw.addr), c.method, &c.path, c.body.as_deref(), &headers);
        assert_eq!(r.status, c.status, "{what}: {}", r.text());
        let key = (c.method.to_owned(), c.op.to_owned());
        assert!(self.spec.statuses(c.method, c.op).contains(&r.status.to_string()), "{what}: status not in the spec");
        self.seen.insert(key.clone());
        if (200..300).contains(&r.status) {
            self.succeeded.insert(key);
        }
        self.check_body(c.method, c.op, &r, &what);
        r
    }

    fn check_body(&self, method: &str, op: &str, r: &Response, what: &str) {
        let listed = self.spec.media_types(method, op, r.status);
        // A body-less answer (a 304 keeps its representation's content type).
        if listed.is_empty() {
            assert!(r.body.is_empty(), "{what}: a body where the spec gives none");
            return;
        }
        let ct = r.header("content-type").unwrap_or_else(|| panic!("{what}: a body without a content type"));
        let media = bare_media(ct);
        assert!(listed.contains(&media), "{what}: {media} is not among {listed:?}");
        let Some(schema) = self.spec.response_schema(method, op, r.status, &media) else { return };
        let valid = |schema: &str, v: &Value| {
            let errors = self.spec.errors(schema, v);
            assert!(errors.is_empty(), "{what}: not valid under {schema}: {errors:#?}\n{v}");
        };
        match media.as_str() {
            "application/json" => valid(&schema, &r.json()),
            "text/event-stream" => {
                let data_schema = self.spec.sse_data_schema(&schema);
                let events = sse_events(&r.text());
                assert!(!events.is_empty(), "{what}: an empty stream");
                for (name, data) in events {
                    valid(&schema, &json!({"event": name, "data": data}));
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{what}: {e}: {data}"));
                    valid(&data_schema, &v);
                    if name != "message" {
                        assert_eq!(Some(name.as_str()), v["type"].as_str(), "{what}: event name and type");
                    }
                }
            }
            _ => {}
        }
    }
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6})
}

fn message(model: &str) -> Value {
    json!({"model": model, "max_tokens": 6, "messages": [{"role": "user", "content": "Say hi."}]})
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn without(mut v: Value, key: &str) -> Value {
    v.as_object_mut().unwrap().remove(key);
    v
}

#[test]
fn every_operation_answers_as_the_spec_says() {
    let (smol, gemma) = (model_path(SMOLLM), model_path(GEMMA));
    let (smol, gemma) = (format!("smol={}", smol.display()), format!("gemma={}", gemma.display()));
    let max_body = MAX_BODY.to_string();
    let args =
        ["--model", &smol, "--model", &gemma, "--model-pool", "2", "--api-key", KEY, "--max-body-bytes", &max_body];
    let mut run =
        Run { spec: Spec::load(), gw: Gateway::start(&args), seen: BTreeSet::new(), succeeded: BTreeSet::new() };
    let big = 1u64 << 25;
    const CHAT: &str = "/v1/chat/completions";
    const MSG: &str = "/v1/messages";

    // Open routes, the key, the guard.
    run.check(Case::get("/health", 200).key("Authorization", None));
    run.check(Case::get("/v1/models", 200));
    run.check(Case::get("/v1/models", 401).key("Authorization", None));
    run.check(Case::get("/engine", 401).key("x-api-key", Some("sk-wrong")));
    run.check(Case::post(CHAT, chat("smol"), 401).key("Authorization", Some("Bearer sk-wrong")));
    run.check(Case::post(MSG, message("smol"), 401).key("x-api-key", None));
    run.check(Case::post(CHAT, chat("smol"), 403).header("Origin", "http://evil.example"));
    let page = run.check(Case::get("/", 200).key("Authorization", None));
    let etag = page.header("etag").expect("an ETag").to_owned();
    run.check(Case::get("/", 304).key("Authorization", None).header("If-None-Match", &etag));
    run.check(Case::get("/ui/{file}", 200).at("/ui/app.js").key("Authorization", None));
    run.check(Case::get("/ui/{file}", 200).at("/ui/base.css"));
    run.check(Case::get("/ui/{file}", 404).at("/ui/nope.js"));

    // Model controls.
    run.check(Case::new("POST", "/api/models/{id}/load", 200).at("/api/models/smol/load"));
    run.check(Case::new("POST", "/api/models/{id}/load", 404).at("/api/models/nope/load"));
    run.check(Case::new("POST", "/api/models/{id}/unload", 404).at("/api/models/nope/unload"));

    // OpenAI chat: both models, a stream, logprobs, a forced tool call, and the errors.
    run.check(Case::post(CHAT, chat("smol"), 200).key("x-api-key", Some(KEY)));
    run.check(Case::post(CHAT, chat("gemma"), 200));
    let streamed = with(chat("smol"), "stream", json!(true));
    run.check(Case::post(CHAT, with(streamed, "stream_options", json!({"include_usage": true})), 200));
    run.check(Case::post(CHAT, with(with(chat("smol"), "logprobs", json!(true)), "top_logprobs", json!(2)), 200));
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let tooled = with(with(chat("smol"), "tools", tools.clone()), "tool_choice", json!("required"));
    run.check(Case::post(CHAT, with(tooled.clone(), "max_tokens", json!(40)), 200));
    run.check(Case::post(CHAT, with(with(tooled, "max_tokens", json!(40)), "stream", json!(true)), 200));
    run.check(Case::post(CHAT, json!(null), 400).raw(b"{\"model\": \"smol\", "));
    run.check(Case::post(CHAT, chat("nope"), 404));
    // JSON of the wrong shape is an invalid value, not invalid JSON, with several models
    // too (the gateway reads `model` before any engine does).
    let r = run.check(Case::post(CHAT, with(chat("smol"), "model", json!(5)), 400).invalid());
    assert_eq!((&r.json()["error"]["code"], &r.json()["error"]["param"]), (&json!("invalid_value"), &json!("model")));
    let r = run.check(Case::post(CHAT, json!([]), 400).invalid());
    assert_eq!(r.json()["error"]["code"], "invalid_value", "{}", r.text());
    run.check(Case::post(CHAT, without(chat("smol"), "messages"), 400).invalid());
    run.check(Case::post(CHAT, with(chat("smol"), "max_tokens", json!(big)), 400).invalid());
    run.check(Case::post(CHAT, with(chat("smol"), "n", json!(2)), 400).invalid());
    run.check(Case::post(CHAT, with(chat("smol"), "stop", json!(vec!["x"; 17])), 400).invalid());
    run.check(Case::post(CHAT, with(chat("smol"), "temperature", json!(-1)), 400).invalid());
    run.check(Case::post(CHAT, json!({"model": "smol", "messages": ["x".repeat(MAX_BODY)]}), 413));

    // Completions and the template.
    const CMPL: &str = "/v1/completions";
    let cmpl = json!({"model": "smol", "prompt": "Once upon a time", "max_tokens": 5});
    run.check(Case::post(CMPL, with(cmpl.clone(), "logprobs", json!(2)), 200));
    run.check(Case::post(CMPL, json!({"model": "gemma", "prompt": [[2, 100, 200]], "max_tokens": 3}), 200));
    let streamed = with(with(cmpl.clone(), "stream", json!(true)), "stream_options", json!({"include_usage": true}));
    run.check(Case::post(CMPL, streamed, 200));
    run.check(Case::post(CMPL, with(cmpl.clone(), "echo", json!(true)), 400).invalid());
    run.check(Case::post(CMPL, without(cmpl.clone(), "prompt"), 400).invalid());
    run.check(Case::post(CMPL, with(cmpl, "max_tokens", json!(0)), 400).invalid());
    run.check(Case::post("/apply-template", without(chat("gemma"), "max_tokens"), 200));
    run.check(Case::post("/apply-template", json!({"model": "smol", "messages": []}), 400).invalid());

    // Anthropic Messages and count_tokens, errors in Anthropic's shape.
    run.check(Case::post(MSG, message("smol"), 200).key("x-api-key", Some(KEY)));
    run.check(Case::post(MSG, with(message("gemma"), "stream", json!(true)), 200));
    run.check(Case::post(MSG, without(message("smol"), "max_tokens"), 400).invalid());
    run.check(Case::post(MSG, with(message("smol"), "max_tokens", json!(big)), 400).invalid());
    run.check(Case::post(MSG, message("nope"), 404));
    run.check(Case::post(MSG, json!(null), 400).raw(b"not json"));
    const COUNT: &str = "/v1/messages/count_tokens";
    run.check(Case::post(COUNT, without(message("smol"), "max_tokens"), 200));
    run.check(
        Case::post(COUNT, json!({"model": "smol", "messages": [{"role": "robot", "content": "x"}]}), 400).invalid(),
    );

    // OpenAI Responses, stored and continued, then read and deleted.
    const RESP: &str = "/v1/responses";
    let req = json!({"model": "smol", "input": "My name is Ada.", "max_output_tokens": 6});
    let first = run.check(Case::post(RESP, req.clone(), 200)).json();
    let id = first["id"].as_str().unwrap().to_owned();
    let next = json!({"model": "smol", "input": "What is my name?", "previous_response_id": id, "max_output_tokens": 6,
        "stream": true});
    run.check(Case::post(RESP, next, 200));
    run.check(Case::post(RESP, with(req.clone(), "previous_response_id", json!("resp_unknown")), 404));
    run.check(Case::post(RESP, with(req.clone(), "max_output_tokens", json!(big)), 400).invalid());
    run.check(Case::post(RESP, without(req, "input"), 400).invalid());
    let stored = format!("/v1/responses/{id}");
    let got = run.check(Case::get("/v1/responses/{id}", 200).at(&stored)).json();
    assert_eq!(got, first, "stored as answered");
    run.check(Case::new("DELETE", "/v1/responses/{id}", 200).at(&stored));
    run.check(Case::new("DELETE", "/v1/responses/{id}", 404).at(&stored));
    run.check(Case::get("/v1/responses/{id}", 404).at(&stored));

    // Monitoring with both engines ready, then an unload.
    run.check(Case::get("/engine", 200));
    run.check(Case::get("/stats", 200));
    run.check(Case::get("/metrics", 200));
    run.check(Case::new("POST", "/api/models/{id}/unload", 200).at("/api/models/gemma/unload"));
    run.check(Case::get("/stats", 200));

    let listed = run.spec.operations();
    assert_eq!(run.seen, listed, "every operation in the spec was asked");
    assert_eq!(run.succeeded, listed, "every operation in the spec answered a success (none is 404/405)");
}
