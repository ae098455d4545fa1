//! Forwarding a public request to its model's engine.
//!
//! The body is read (bounded) only to find `model`; the bytes go to the engine
//! unchanged and its response streams back unchanged, frame by frame. Rules (see
//! `docs/gateway.md`): a connection that never reached the engine is retried once
//! (after the pool replaces the engine); once the request was sent nothing is retried;
//! no response head within `engine_timeout` is 504 and the engine is recycled; a broken
//! or garbled response before the head is 502; failures after the head are handled in
//! `body::ProxyBody`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corral_pool::Lease;
use corral_pool::unix_http::{self, UnixHttpError};
use corral_protocol::{ApiError, ErrorKind};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::body::{Body, Failure, ProxyBody};
use crate::server::{App, error_response};

/// Headers that describe one hop, not the message.
const HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::HOST,
];

fn strip_hop(h: &mut HeaderMap) {
    for name in HOP.iter() {
        h.remove(name);
    }
}

/// The only fields the gateway reads (unknown ones are ignored, as are wrong types of
/// `stream`: the engine judges those).
#[derive(serde::Deserialize)]
struct Routing {
    model: Option<String>,
    stream: Option<serde_json::Value>,
}

/// Read a body of at most `limit` bytes.
pub async fn read_body(req: Request<Incoming>, limit: usize) -> Result<(http::request::Parts, Bytes), ApiError> {
    let too_big = || ApiError::new(ErrorKind::PayloadTooLarge, format!("the request body is over {limit} bytes"));
    if req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64)
    {
        return Err(too_big());
    }
    let (parts, body) = req.into_parts();
    let bytes = http_body_util::Limited::new(body, limit).collect().await.map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            too_big()
        } else {
            ApiError::new(ErrorKind::InvalidJson, format!("reading the body: {e}"))
        }
    })?;
    Ok((parts, bytes.to_bytes()))
}

pub async fn forward(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = match read_body(req, app.cfg.max_body_bytes).await {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    // Only `model` is read; anything else about the body is the engine's to judge.
    let (model, sse_wanted) = match serde_json::from_slice::<Routing>(&body) {
        Ok(r) => (r.model, r.stream.and_then(|s| s.as_bool()).unwrap_or(false)),
        Err(e) if app.pool.default_model().is_none() => {
            return error_response(&ApiError::new(ErrorKind::InvalidJson, format!("invalid JSON: {e}")));
        }
        Err(_) => (None, false),
    };
    let mut attempt = 0;
    loop {
        let lease = match app.pool.lease(model.as_deref()).await {
            Ok(l) => l,
            Err(e) => return error_response(&e),
        };
        match send(&app, &lease, &parts, body.clone()).await {
            Ok(resp) => return respond(&app, resp, lease, sse_wanted),
            Err(SendError::NotConnected(e)) if attempt == 0 => {
                // Nothing reached the engine (it died or is being replaced): safe to retry.
                tracing::info!(model = %lease.model, error = %e, "engine unreachable; retrying once");
                attempt += 1;
                lease.release();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(SendError::NotConnected(e)) => {
                app.stats.proxy_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return error_response(&ApiError::new(
                    ErrorKind::EngineUnavailable,
                    format!("the engine is unreachable: {e}"),
                ));
            }
            Err(SendError::Failed(e)) => {
                app.stats.proxy_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                app.pool.recycle(&lease.model, lease.pid);
                return error_response(&ApiError::new(
                    ErrorKind::EngineUnavailable,
                    format!("the engine failed before answering: {e}"),
                ));
            }
            Err(SendError::Timeout) => {
                app.stats.proxy_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                app.pool.recycle(&lease.model, lease.pid);
                return error_response(&ApiError::new(ErrorKind::EngineTimeout, "the engine did not answer in time"));
            }
        }
    }
}

enum SendError {
    NotConnected(UnixHttpError),
    Failed(hyper::Error),
    Timeout,
}

async fn send(
    app: &App,
    lease: &Lease,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Incoming>, SendError> {
    let mut tx = unix_http::connect::<Full<Bytes>>(&lease.socket).await.map_err(SendError::NotConnected)?;
    let mut req =
        Request::builder().method(parts.method.clone()).uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    if let Some(h) = req.headers_mut() {
        *h = parts.headers.clone();
        strip_hop(h);
        h.insert(header::HOST, HeaderValue::from_static("engine"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let req = req.body(Full::new(body)).map_err(|_| SendError::Timeout)?;
    match tokio::time::timeout(app.cfg.engine_timeout, tx.send_request(req)).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(SendError::Failed(e)),
        Err(_) => Err(SendError::Timeout),
    }
}

fn respond(app: &Arc<App>, resp: Response<Incoming>, lease: Lease, sse_wanted: bool) -> Response<Body> {
    let (mut parts, upstream) = resp.into_parts();
    strip_hop(&mut parts.headers);
    let sse = sse_wanted
        || parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    let (pool, model, pid) = (app.pool.clone(), lease.model.clone(), lease.pid);
    let on_failure = Box::new(move |why: Failure| {
        if let Failure::Stalled = why {
            pool.recycle(&model, pid);
        }
    });
    let body = ProxyBody::new(upstream, lease, sse, app.cfg.stall_timeout, app.stats.clone(), on_failure);
    Response::from_parts(parts, Body::Proxy(Box::new(body)))
}
