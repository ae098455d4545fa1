//! Forwarding a public request to its model's engine (or, for an upstream model, to
//! `upstream::forward`; both hand the answer to `pass_through.rs`).
//!
//! The body is read (bounded in size and time) only to find `model` and check the request
//! bounds (`protocol::bounds`: `max_tokens`, `n`, stop strings); the bytes go to the engine unchanged
//! and its response streams back unchanged, frame by frame. What happens on each failure
//! is `proxy_error`'s table: a connection that never reached the engine is retried once,
//! on an engine other than the one that refused; nothing else is retried; the engine is
//! recycled only when it is to blame (garbage, no head in time, a stall). Failures after
//! the head are handled in `body::ProxyBody`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use corral_net::body::read_limited;
use corral_net::gauge::Guard;
use corral_pool::Lease;
use corral_pool::unix_http;
use corral_protocol::bounds::Outline;
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::app::App;
use crate::body::Body;
use crate::pass_through::{Forwarded, pass_through, strip_hop};
use crate::proxy_error::{ENGINE, Kind, ProxyError};
use crate::respond;
use crate::route::Route;
use crate::stored_routes;
use crate::target::Target;

pub async fn forward(app: Arc<App>, route: Route, req: Request<Incoming>, guard: Guard) -> Response<Body> {
    let shape = route.shape();
    let (mut parts, body) = match read_limited(req, app.cfg.max_body_bytes, app.cfg.body_timeout).await {
        Ok(x) => x,
        Err(e) => {
            tracing::info!(error = %e, "request body refused");
            return respond::error(shape, &e.into());
        }
    };
    // Only `model`, `stream` and the bounded fields are read; anything else about the
    // body is the engine's (or the upstream's) to judge.
    let (model, sse_wanted, outline) = match Outline::read(&body, shape) {
        Ok(o) => (o.model.clone(), o.streams(), Some(o)),
        // Not JSON, or not an object: no engine would take it, so none is started for it.
        // With several models the body must name one. With one model, an object of
        // another shape (`"model": 5`) goes to its engine, whose full parse names the field.
        Err(e)
            if e.kind == ErrorKind::InvalidJson
                || !json_object(&body)
                || crate::target::default_model(&app).is_none() =>
        {
            return respond::error(shape, &e);
        }
        Err(_) => (None, false, None),
    };
    if let Some(m) = &model {
        tracing::Span::current().record("model", m.as_str());
    }
    match crate::target::resolve(&app, model.as_deref()) {
        Ok(Target::Local) => {}
        // An upstream judges its own bounds (it may well take `n` > 1).
        Ok(Target::Upstream(up)) => {
            return crate::upstream::forward::forward(app, up, route, parts, body, sse_wanted, guard).await;
        }
        Err(e) => return respond::error(shape, &e.into()),
    }
    // Bounds are checked before any engine is chosen or started. count_tokens generates
    // nothing: its engine ignores `max_tokens`.
    if route != Route::CountTokens
        && let Some(o) = &outline
        && let Err(e) = o.check(shape)
    {
        return respond::error(shape, &e);
    }
    // Responses: the stored conversation goes in, the answer is captured on its way out.
    let (body, mut capture) = if route == Route::Responses {
        match stored_routes::prepare(&app.responses, &mut parts.headers, body) {
            Ok(p) => (p.body, p.capture),
            Err(e) => return respond::error(shape, &e),
        }
    } else {
        (body, None)
    };
    let mut refused_by: Option<u32> = None;
    loop {
        let lease = match app.pool.lease_avoiding(model.as_deref(), refused_by).await {
            Ok(l) => l,
            Err(e) => return respond::error(shape, &e.into()),
        };
        match send(&app, &lease, &parts, body.clone()).await {
            Ok(resp) => {
                let (app2, model, pid) = (app.clone(), lease.model.clone(), lease.pid);
                let on_failure = Box::new(move |e: &ProxyError| {
                    tracing::warn!(model = %model, pid, error = %e, "engine response failed mid-body");
                    app2.stats.proxy_errors.fetch_add(1, Ordering::Relaxed);
                    if e.kind.recycles_engine() {
                        app2.pool.recycle(&model, pid);
                    }
                });
                let claim = Box::new(lease);
                let fwd =
                    Forwarded { claim, guard, sse_wanted, shape, capture: capture.take(), on_failure, who: ENGINE };
                return pass_through(&app, resp, fwd);
            }
            Err(e) if e.kind.retry() && refused_by.is_none() => {
                // Nothing reached the engine (it died or is being replaced): wait for one
                // that is not this process, and send it there.
                tracing::info!(model = %lease.model, pid = lease.pid, error = %e, "engine unreachable; retrying once");
                refused_by = Some(lease.pid);
            }
            Err(e) => return fail(&app, &lease, e, shape),
        }
    }
}

/// Whether a body that parsed as JSON is an object (every API's request is one).
fn json_object(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Apply the table to a failure before the head: count, recycle, answer.
fn fail(app: &App, lease: &Lease, e: ProxyError, shape: ApiShape) -> Response<Body> {
    tracing::warn!(model = %lease.model, pid = lease.pid, error = %e, "proxying failed");
    if e.kind.side() != crate::proxy_error::Side::Downstream {
        app.stats.proxy_errors.fetch_add(1, Ordering::Relaxed);
    }
    if e.kind.recycles_engine() {
        app.pool.recycle(&lease.model, lease.pid);
    }
    let api = e.to_api().unwrap_or_else(|| ApiError::new(ErrorKind::Internal, e.to_string()));
    respond::error(shape, &api)
}

/// The request as the engine gets it: same method, path, headers (minus hop-by-hop)
/// and body.
fn engine_request(parts: &http::request::Parts, body: Bytes) -> Result<Request<Full<Bytes>>, ProxyError> {
    let mut req =
        Request::builder().method(parts.method.clone()).uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    if let Some(h) = req.headers_mut() {
        *h = parts.headers.clone();
        strip_hop(h);
        h.insert(header::HOST, HeaderValue::from_static("engine"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    req.body(Full::new(body)).map_err(|e| ProxyError::new(Kind::Build, e))
}

async fn send(
    app: &App,
    lease: &Lease,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Incoming>, ProxyError> {
    let req = engine_request(parts, body)?;
    let mut tx =
        unix_http::connect::<Full<Bytes>>(&lease.socket).await.map_err(|e| ProxyError::new(Kind::Connect, e))?;
    match tokio::time::timeout(app.cfg.engine_timeout, tx.send_request(req)).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) if e.is_parse() || e.is_parse_status() => Err(ProxyError::new(Kind::BadHead, e)),
        Ok(Err(e)) => Err(ProxyError::new(Kind::Send, e)),
        Err(_) => {
            Err(ProxyError::new(Kind::HeadTimeout, format!("no answer in {} ms", app.cfg.engine_timeout.as_millis())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_gets_the_same_request_minus_hop_headers() {
        let req = Request::builder()
            .method("POST")
            .uri("http://example.com/v1/chat/completions?x=1")
            .header("connection", "keep-alive")
            .header("x-custom", "kept")
            .header("host", "example.com")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let out = engine_request(&parts, Bytes::from_static(b"{}")).unwrap();
        assert_eq!(out.uri(), "/v1/chat/completions?x=1");
        assert_eq!(out.headers()["host"], "engine");
        assert_eq!(out.headers()["x-custom"], "kept");
        assert_eq!(out.headers()["content-length"], "2");
        assert!(out.headers().get("connection").is_none());
    }
}
