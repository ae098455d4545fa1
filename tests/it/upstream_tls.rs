//! An `https://` upstream: a front `corral serve` whose model `big` is a replica behind a
//! TLS front (tests/common/tls_front.rs) with a certificate from a private CA made here.
//! Trusted through `SSL_CERT_FILE`, requests go through over HTTP/2 with the upstream's
//! key; with a trust store that lacks the CA (another private CA's, so the outcome does
//! not hang on the machine's roots), the upstream is down and a request gets a prompt error that
//! names the certificate problem and what to do.

use std::time::{Duration, Instant};

use crate::common::TempDir;
use crate::common::gateway::{Gateway, wait_until};
use crate::common::tls_front::{Certs, TlsFront};
use crate::common::upstream::{
    CLUSTER_KEY, FRONT_KEY, KEY_VAR, call, chat, front_env, replica, stream, streamed_text, upstream_of,
};
use hyper::Version;
use serde_json::json;

/// A front gateway for `https://localhost:<port>` that trusts the CA of `trusted`.
fn front_trusting(trusted: &Certs, port: u16, tag: &str) -> Gateway {
    let dir = TempDir::new(tag);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &trusted.ca_pem).unwrap();
    let config = format!(
        "[models.big]\nupstream = \"https://localhost:{port}\"\nupstream-model = \"smol\"\n\
         api-key-env = \"{KEY_VAR}\"\nhealth-interval = \"300ms\"\nconnect-timeout = \"2s\"\n"
    );
    front_env(&config, dir, &[("SSL_CERT_FILE", ca.to_str().unwrap())])
}

#[test]
fn an_https_upstream_is_reached_over_http2_with_a_private_ca() {
    let certs = Certs::new("corral test CA");
    let b = replica(None);
    let tls = TlsFront::start(&certs, &b.addr);
    let a = front_trusting(&certs, tls.port, "upstream-tls");
    assert!(wait_until(Duration::from_secs(10), || upstream_of(&a, "big")["state"] == "ready"), "{}", a.log());
    assert_eq!(upstream_of(&a, "big")["replicas"][0]["health"], "up");

    let via = call(&a.addr, "POST", "/v1/chat/completions", Some(&chat("big", 8)), FRONT_KEY);
    assert_eq!(via.status, 200, "{}", via.text());
    let direct = call(&b.addr, "POST", "/v1/chat/completions", Some(&chat("smol", 8)), CLUSTER_KEY).json();
    let v = via.json();
    assert_eq!(v["model"], "smol", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], direct["choices"][0]["message"]["content"]);

    let mut body = chat("big", 8);
    body["stream"] = json!(true);
    let mut d = body.clone();
    d["model"] = json!("smol");
    let text = streamed_text(&mut stream(&a.addr, "/v1/chat/completions", &body, FRONT_KEY));
    assert_eq!(text, streamed_text(&mut stream(&b.addr, "/v1/chat/completions", &d, CLUSTER_KEY)));
    assert!(!text.is_empty());

    // Every request crossed TLS as HTTP/2 (ALPN), the health checks too, each with the
    // upstream's key and never the client's.
    let seen = tls.seen();
    let chats = seen.iter().filter(|s| s.path == "/v1/chat/completions").count();
    assert_eq!(chats, 2, "{seen:?}");
    assert!(seen.iter().any(|s| s.path == "/v1/models"), "{seen:?}");
    let key = format!("Bearer {CLUSTER_KEY}");
    assert!(seen.iter().all(|s| s.version == Version::HTTP_2 && s.auth.as_deref() == Some(key.as_str())), "{seen:?}");
    assert_eq!(upstream_of(&a, "big")["state"], "ready");
}

#[test]
fn an_untrusted_certificate_is_a_prompt_error_naming_it() {
    let (certs, other) = (Certs::new("corral test CA"), Certs::new("some other CA"));
    // Nothing gets past the handshake, so the backend is never asked.
    let tls = TlsFront::start(&certs, "127.0.0.1:9");
    let a = front_trusting(&other, tls.port, "upstream-tls-untrusted");
    assert!(wait_until(Duration::from_secs(10), || upstream_of(&a, "big")["state"] == "down"), "{}", a.log());
    let u = upstream_of(&a, "big");
    let why = u["replicas"][0]["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("certificate"), "{u}");

    for stream in [false, true] {
        let mut body = chat("big", 8);
        body["stream"] = json!(stream);
        let t = Instant::now();
        let r = call(&a.addr, "POST", "/v1/chat/completions", Some(&body), FRONT_KEY);
        assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
        assert_eq!(r.status, 502, "{}", r.text());
        let e = r.json();
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("upstream big") && msg.contains("certificate") && msg.contains("SSL_CERT_FILE"), "{e}");
        assert_eq!(
            (e["error"]["type"].as_str(), e["error"]["code"].as_str()),
            (Some("server_error"), Some("engine_unavailable")),
            "{e}"
        );
    }
    assert!(tls.seen().is_empty(), "{:?}", tls.seen());
    assert_eq!(upstream_of(&a, "big")["state"], "down");
}
