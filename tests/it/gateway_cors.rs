//! CORS on a real `corral serve` (fake engine): no CORS headers at all by default; with
//! `--allow-origin`, a listed origin's requests are echoed exactly with `Vary: Origin`
//! (errors included), its preflights answered 204 with the API's headers, and its POSTs
//! pass the Origin check; any other origin gets no CORS headers, a 403 preflight, and a
//! 403 on state-changing requests.

use crate::common::gateway::*;
use crate::common::http::{self, Response};
use serde_json::{Value, json};

const APP: &str = "http://localhost:5173";

fn call(gw: &Gateway, method: &str, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> Response {
    let bytes = body.map(Value::to_string);
    http::request(http::tcp(&gw.addr), method, path, bytes.as_deref().map(str::as_bytes), headers)
}

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

fn cors_headers(r: &Response) -> Vec<String> {
    r.headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
        .map(|(k, _)| k.clone())
        .collect()
}

fn preflight(gw: &Gateway, origin: &str, path: &str, method: &str, headers: &str) -> Response {
    let h =
        [("Origin", origin), ("Access-Control-Request-Method", method), ("Access-Control-Request-Headers", headers)];
    call(gw, "OPTIONS", path, None, &h)
}

#[test]
fn without_allow_origin_nothing_carries_cors_headers() {
    let gw = fake_gateway(&[("m", json!({"tokens": 2}))], &[]);
    let r = call(&gw, "GET", "/v1/models", None, &[("Origin", APP)]);
    assert_eq!(r.status, 200);
    assert!(cors_headers(&r).is_empty() && r.header("vary").is_none(), "{:?}", r.headers);
    let r = preflight(&gw, APP, "/v1/chat/completions", "POST", "content-type");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{}", r.text());
    assert!(cors_headers(&r).is_empty(), "{:?}", r.headers);
    let r = call(&gw, "POST", "/v1/chat/completions", Some(&chat()), &[("Origin", APP)]);
    assert_eq!(r.status, 403, "a page on another origin may not generate");
}

#[test]
fn a_listed_origin_is_echoed_preflighted_and_may_post() {
    let gw = fake_gateway(
        &[("m", json!({"tokens": 2}))],
        &["--allow-origin", "https://other.example,http://localhost:5173", "--api-key", "k3y-for-cors-test"],
    );
    // The preflight carries no key (browsers never send one there) and is answered.
    let asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count, openai-beta";
    let r = preflight(&gw, APP, "/v1/chat/completions", "POST", asked);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
    assert_eq!(r.header("access-control-allow-headers"), Some(asked));
    assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    assert!(r.header("access-control-allow-credentials").is_none());
    let r = preflight(&gw, APP, "/v1/messages", "POST", "x-api-key, anthropic-version, content-type");
    assert_eq!(r.header("access-control-allow-headers"), Some("x-api-key, anthropic-version, content-type"));
    let r = preflight(&gw, APP, "/v1/responses/resp_1", "DELETE", "");
    assert_eq!((r.status, r.header("access-control-allow-methods")), (204, Some("GET, DELETE")));

    // The request itself: echoed exactly, errors included, so the page can read them.
    let key = ("Authorization", "Bearer k3y-for-cors-test");
    let r = call(&gw, "POST", "/v1/chat/completions", Some(&chat()), &[("Origin", APP), key]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    let r = call(&gw, "POST", "/v1/chat/completions", Some(&chat()), &[("Origin", APP)]);
    assert_eq!((r.status, r.header("access-control-allow-origin")), (401, Some(APP)), "the 401 is readable");
    assert_eq!(r.header("access-control-expose-headers"), Some("retry-after, warning"));

    // Another origin: no CORS headers, a refused preflight, no state change.
    for other in ["http://localhost:5174", "https://localhost:5173", "https://evil.example", "null"] {
        let r = preflight(&gw, other, "/v1/chat/completions", "POST", "authorization");
        assert_eq!(r.status, 403, "{other}");
        assert!(cors_headers(&r).is_empty(), "{other}: {:?}", r.headers);
        let r = call(&gw, "POST", "/v1/chat/completions", Some(&chat()), &[("Origin", other), key]);
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{other}");
        assert!(cors_headers(&r).is_empty(), "{other}");
        let r = call(&gw, "GET", "/v1/models", None, &[("Origin", other), key]);
        assert_eq!(r.status, 200);
        assert!(cors_headers(&r).is_empty(), "a read is answered but not shared with {other}");
    }
    // A plain OPTIONS (not a preflight) is still just a method the route does not take.
    assert_eq!(call(&gw, "OPTIONS", "/v1/chat/completions", None, &[]).status, 405);
}
