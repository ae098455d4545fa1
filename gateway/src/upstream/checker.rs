//! The periodic health check of an upstream's replicas: `GET /v1/models` on each (with
//! the upstream's key), every `health-interval`, all replicas at once. A 200 puts a
//! replica up and tells what the upstream serves (`card::read`); a refused connection
//! takes it out at once, other failures at the second in a row (`health.rs`). The first
//! round runs at start; the loop ends with the gateway.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corral_net::CancellationToken;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};

use super::health::Seen;
use super::{Upstream, card, client};

/// The most of a `/v1/models` answer read.
const MAX_MODELS_BYTES: usize = 1 << 20;
/// The longest a check may take (less when the interval is shorter).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// An error and its causes, one line (hyper's own message alone says little), and what
/// to do about a TLS failure that does not say it.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    if let Some(hint) = client::tls_hint(e) {
        s.push_str(" — ");
        s.push_str(hint);
    }
    s
}

/// Check every replica now, then every interval, until `stop`.
pub async fn run(up: Arc<Upstream>, stop: CancellationToken) {
    loop {
        round(&up).await;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(up.spec.health_interval) => {}
        }
    }
}

async fn round(up: &Arc<Upstream>) {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..up.replicas.len() {
        let up = up.clone();
        set.spawn(async move {
            let (seen, reported) = check(&up, i).await;
            up.replicas[i].seen(up.id(), seen);
            if let Some(r) = reported {
                up.set_reported(r);
            }
        });
    }
    while set.join_next().await.is_some() {}
}

async fn check(up: &Upstream, i: usize) -> (Seen, Option<card::Reported>) {
    let base = &up.replicas[i].base;
    let uri = match base.uri("/v1/models") {
        Ok(u) => u,
        Err(e) => return (Seen::Failed(format!("bad URI: {e}")), None),
    };
    let mut req = Request::builder().method(Method::GET).uri(uri);
    if let Some(k) = up.key() {
        req = req.header(header::AUTHORIZATION, k.clone());
    }
    let Ok(req) = req.body(Full::new(Bytes::new())) else {
        return (Seen::Failed("the check could not be formed".into()), None);
    };
    let limit = CHECK_TIMEOUT.min(up.spec.health_interval.max(Duration::from_millis(500)));
    let exchange = async {
        let resp = up.client.request(req).await.map_err(|e| {
            let msg = chain(&e);
            if e.is_connect() { Seen::Refused(msg) } else { Seen::Failed(msg) }
        })?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_MODELS_BYTES)
            .collect()
            .await
            .map_err(|e| Seen::Failed(format!("reading /v1/models: {e}")))?
            .to_bytes();
        if status != http::StatusCode::OK {
            return Err(Seen::Failed(format!("GET /v1/models answered {status}")));
        }
        Ok(body)
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(Ok(body)) => (Seen::CheckOk, Some(card::read(&body, up.spec.remote_name()))),
        Ok(Err(seen)) => (seen, None),
        Err(_) => (Seen::Failed(format!("no answer to GET /v1/models in {} ms", limit.as_millis())), None),
    }
}
