//! The Host and Origin guard on a real `corral serve` (a fake engine is configured; no
//! request here reaches it): a foreign Host (DNS rebinding) is 403 in the API's own error
//! shape, a missing Host 400, a cross-site POST 403 even to a route that exists, while
//! the loopback names, `--allow-host` names and same-origin POSTs pass.

use crate::common::gateway::*;
use crate::common::http::{self, Response};
use serde_json::json;

/// One raw request (`head` is the request line and headers, each ending in CRLF).
fn raw(gw: &Gateway, head: &str, body: &str) -> Response {
    let head = format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    http::raw(&gw.addr, &head, body.as_bytes())
}

#[test]
fn foreign_hosts_and_cross_site_writes_are_refused_in_each_api_shape() {
    let gw = fake_gateway(&[("m", json!({}))], &["--allow-host", "box.lan"]);
    let port = gw.addr.rsplit(':').next().expect("port").to_owned();

    // A rebound name: refused before routing to any engine, in each API's shape.
    let r = raw(&gw, &format!("GET /v1/models HTTP/1.1\r\nHost: evil.example:{port}\r\n"), "");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (403, Some("host_not_allowed")), "{}", r.text());
    let body = r#"{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = raw(&gw, &format!("POST /v1/messages HTTP/1.1\r\nHost: attacker.test:{port}\r\n"), body);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        (r.json()["type"].as_str(), r.json()["error"]["type"].as_str()),
        (Some("error"), Some("permission_error"))
    );
    let r = raw(&gw, &format!("GET / HTTP/1.1\r\nHost: localhost:{}\r\n", port.parse::<u16>().unwrap() + 1), "");
    assert_eq!(r.status, 403, "another port is another server");
    // No Host at all.
    let r = raw(&gw, "GET /v1/models HTTP/1.0\r\n", "");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("missing_host")), "{}", r.text());

    // Our names pass.
    for host in
        [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("box.lan:{port}"), "localhost".into()]
    {
        let r = raw(&gw, &format!("GET /health HTTP/1.1\r\nHost: {host}\r\n"), "");
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }

    // A state-changing request a browser marked with a foreign origin, then with ours.
    let post = |origin: &str| {
        let head = format!("POST /api/models/nope/unload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n");
        raw(&gw, &head, "")
    };
    let r = post("https://evil.example");
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{}", r.text());
    let r = post(&format!("http://127.0.0.1:{port}"));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (404, Some("model_not_found")), "{}", r.text());
    // Reads from any origin are answered (the browser keeps the answer from the page).
    let r =
        raw(&gw, &format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: https://evil.example\r\n"), "");
    assert_eq!(r.status, 200);

    // None of it started an engine.
    assert_eq!(gw.engine_of("m")["state"], "stopped", "{}", gw.engine());
}
