//! A request for an upstream model, there and back: the API is checked against what
//! the upstream serves (else 501 in the route's shape, naming the upstream), `model` is
//! set to the upstream's name, the client's key is swapped for the upstream's, and the
//! request goes to the replica with the fewest requests in flight. A replica that
//! refuses the connection or breaks before answering is marked and the request goes on
//! to another one, each at most once; once a response head has come nothing is
//! retried, and the body streams back frame by frame through the same pass-through as
//! an engine's (the client leaving drops the upstream connection, which cancels it).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use corral_net::gauge::Guard;
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;

use super::checker::chain;
use super::health::Seen;
use super::spec::Api;
use super::{Upstream, card, rewrite};
use crate::app::App;
use crate::body::Body;
use crate::pass_through::{self, Forwarded};
use crate::proxy_error::{Kind, ProxyError, UPSTREAM};
use crate::respond;
use crate::route::Route;

/// The API a proxied route reaches an upstream through.
pub fn api_of(route: Route) -> Api {
    match route {
        Route::Completions => Api::Completions,
        Route::Messages | Route::CountTokens => Api::Messages,
        Route::Responses => Api::Responses,
        Route::ApplyTemplate => Api::ApplyTemplate,
        _ => Api::Chat,
    }
}

/// The 501 for an API the upstream does not serve.
pub fn unsupported(up: &Upstream, api: Api) -> ApiError {
    let serves: Vec<&str> = Api::ALL
        .into_iter()
        .filter(|a| card::serves(*a, up.spec.apis.as_deref(), up.reported().and_then(|r| r.capabilities).as_ref()))
        .map(Api::name)
        .collect();
    ApiError::new(
        ErrorKind::NotImplemented,
        format!(
            "model {} is served by the upstream at {}, which does not offer {} (it offers: {}); \
             list the APIs it has with `apis` in its [models.{}] table",
            up.id(),
            up.replicas.first().map(|r| r.base.to_string()).unwrap_or_default(),
            api.describe(),
            if serves.is_empty() { "none".to_owned() } else { serves.join(", ") },
            up.id(),
        ),
    )
}

pub async fn forward(
    app: Arc<App>,
    up: Arc<Upstream>,
    route: Route,
    parts: http::request::Parts,
    body: Bytes,
    sse_wanted: bool,
    guard: Guard,
) -> Response<Body> {
    let shape = route.shape();
    let api = api_of(route);
    let caps = up.reported().and_then(|r| r.capabilities);
    if !card::serves(api, up.spec.apis.as_deref(), caps.as_ref()) {
        tracing::info!(model = up.id(), api = api.name(), "API not offered by the upstream");
        return respond::error(shape, &unsupported(&up, api));
    }
    let body = rewrite::set_model(&body, up.spec.remote_name()).unwrap_or(body);
    let mut headers = parts.headers.clone();
    pass_through::strip_hop(&mut headers);
    rewrite::headers(&mut headers, up.key());
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let head_timeout = up.spec.timeout.unwrap_or(app.cfg.engine_timeout);
    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<ProxyError> = None;
    loop {
        let Some((i, claim)) = up.claim(&tried) else {
            let e = last.unwrap_or_else(|| {
                let why = up.replicas.iter().filter_map(|r| r.health().last_error).next_back().unwrap_or_default();
                ProxyError::new(Kind::Connect, format!("upstream {}: no replica is up ({why})", up.id())).by(UPSTREAM)
            });
            return fail(&app, &up, e, shape);
        };
        let replica = &up.replicas[i];
        let req = match build(&parts.method, replica.base.uri(path), &headers, body.clone()) {
            Ok(r) => r,
            Err(e) => return fail(&app, &up, e, shape),
        };
        let t = Instant::now();
        let outcome = tokio::time::timeout(head_timeout, up.client.request(req)).await;
        let e = match outcome {
            Ok(Ok(resp)) => {
                replica.seen(up.id(), Seen::Answered);
                replica.answered.fetch_add(1, Ordering::Relaxed);
                up.observe_latency(i, t.elapsed());
                return pass_through(&app, &up, i, resp, Box::new(claim), guard, (sse_wanted, shape));
            }
            Ok(Err(e)) => {
                let kind = if e.is_connect() {
                    Kind::Connect
                } else if bad_head(&e) {
                    Kind::BadHead
                } else {
                    Kind::Send
                };
                ProxyError::new(kind, format!("upstream {} replica {}: {}", up.id(), replica.base, chain(&e)))
            }
            Err(_) => ProxyError::new(
                Kind::HeadTimeout,
                format!("upstream {} replica {}: no answer in {} ms", up.id(), replica.base, head_timeout.as_millis()),
            ),
        }
        .by(UPSTREAM);
        replica.failed.fetch_add(1, Ordering::Relaxed);
        replica.seen(
            up.id(),
            if e.kind == Kind::Connect { Seen::Refused(e.detail.clone()) } else { Seen::Failed(e.detail.clone()) },
        );
        drop(claim);
        tried.push(i);
        if !e.kind.retry_on_another_replica() || tried.len() == up.replicas.len() {
            return fail(&app, &up, e, shape);
        }
        up.retries.fetch_add(1, Ordering::Relaxed);
        tracing::info!(model = up.id(), replica = %replica.base, error = %e, "upstream replica failed before answering; trying another");
        last = Some(e);
    }
}

/// Whether the exchange failed on a response that is not HTTP.
fn bad_head(e: &hyper_util::client::legacy::Error) -> bool {
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            return h.is_parse() || h.is_parse_status();
        }
        src = s.source();
    }
    false
}

fn build(
    method: &http::Method,
    uri: Result<http::Uri, http::Error>,
    headers: &http::HeaderMap,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, ProxyError> {
    let uri = uri.map_err(|e| ProxyError::new(Kind::Build, e))?;
    let mut req = Request::builder().method(method.clone()).uri(uri);
    if let Some(h) = req.headers_mut() {
        *h = headers.clone();
    }
    req.body(Full::new(body)).map_err(|e| ProxyError::new(Kind::Build, e))
}

fn fail(app: &App, up: &Upstream, e: ProxyError, shape: ApiShape) -> Response<Body> {
    tracing::warn!(model = up.id(), error = %e, "proxying to the upstream failed");
    app.stats.proxy_errors.fetch_add(1, Ordering::Relaxed);
    let api = e.to_api().unwrap_or_else(|| ApiError::new(ErrorKind::Internal, e.to_string()));
    respond::error(shape, &api)
}

fn pass_through(
    app: &Arc<App>,
    up: &Arc<Upstream>,
    i: usize,
    resp: Response<Incoming>,
    claim: crate::body::Claim,
    guard: Guard,
    (sse_wanted, shape): (bool, ApiShape),
) -> Response<Body> {
    let (app2, up2) = (app.clone(), up.clone());
    let on_failure = Box::new(move |e: &ProxyError| {
        let replica = &up2.replicas[i];
        tracing::warn!(model = up2.id(), replica = %replica.base, error = %e, "upstream response failed mid-body");
        app2.stats.proxy_errors.fetch_add(1, Ordering::Relaxed);
        replica.failed.fetch_add(1, Ordering::Relaxed);
        replica.seen(up2.id(), Seen::Failed(e.detail.clone()));
    });
    let fwd = Forwarded { claim, guard, sse_wanted, shape, capture: None, on_failure, who: UPSTREAM };
    pass_through::pass_through(app, resp, fwd)
}
