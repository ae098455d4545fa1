//! The gateway's routes, parsed once per request into a `Route`: which handler runs, the
//! methods it allows, the API shape its errors are written in, the label it is counted
//! under, and the request's tracing span. `/admin/*` exists only on engine sockets and
//! is never served here. The web UI (`/`, `/ui/{file}`) and the model controls
//! (`/api/models/{id}/load|unload`) enter through the same table as the API, so they are
//! counted, traced and guarded the same way.
//!
//! Every request passes, in order: the route table (404/405), the Host and Origin guard
//! (`guard.rs`), a CORS preflight's answer (`cors.rs`), the API key (`auth.rs`, on every
//! route but `/health` and the UI's files); then its handler. Whatever answers, a
//! request from an origin listed with `--allow-origin` gets its CORS headers.

use std::sync::Arc;

use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::app::App;
use crate::auth::KeyCheck;
use crate::body::Body;
use crate::cors;
use crate::guard::Verdict;
use crate::route::Refused;
// The table is `route.rs`; named here too for those who read it as `routes::ALL`.
pub use crate::route::{ALL, Route};
use crate::{model_controls, monitor, proxy, respond, stored_routes, ui};

impl Refused {
    fn response(&self) -> Response<Body> {
        match self {
            Refused::NotFound(path) => {
                let shape = if path.starts_with("/v1/messages") { ApiShape::Anthropic } else { ApiShape::OpenAi };
                respond::error(shape, &ApiError::new(ErrorKind::NotFound, format!("no route {path}")))
            }
            Refused::Method { route, method } => {
                let msg = format!("{method} is not allowed on {}", route.path());
                let mut r = respond::error(route.shape(), &ApiError::new(ErrorKind::MethodNotAllowed, msg));
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(route.allow()));
                r
            }
        }
    }
}

/// The request headers the guard, CORS and the key look at, copied out of the request.
struct Marks {
    host: Option<String>,
    origin: Option<String>,
    /// `Access-Control-Request-Method` and `-Headers` (a preflight's).
    cors_method: Option<String>,
    cors_headers: Option<String>,
    key: KeyCheck,
}

impl Marks {
    fn of(app: &App, h: &http::HeaderMap) -> Self {
        let text = |name| h.get(name).and_then(|v: &HeaderValue| v.to_str().ok()).map(str::to_owned);
        let bytes = |name| h.get(name).map(HeaderValue::as_bytes);
        let key = app.cfg.api_key.as_ref().map_or(KeyCheck::Pass, |k| {
            k.check(bytes(header::AUTHORIZATION), bytes(header::HeaderName::from_static("x-api-key")))
        });
        Self {
            host: text(header::HOST),
            origin: text(header::ORIGIN),
            cors_method: text(header::ACCESS_CONTROL_REQUEST_METHOD),
            cors_headers: text(header::ACCESS_CONTROL_REQUEST_HEADERS),
            key,
        }
    }
}

/// Every request enters here.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let marks = Marks::of(&app, req.headers());
    let preflight = cors::is_preflight(req.method(), marks.origin.as_deref(), marks.cors_method.as_deref());
    // A preflight is routed by the method it asks about.
    let method = match &marks.cors_method {
        Some(m) if preflight => Method::from_bytes(m.as_bytes()).unwrap_or(Method::OPTIONS),
        _ => req.method().clone(),
    };
    let route = Route::parse(&method, req.uri().path());
    let label = route.as_ref().map_or_else(Refused::label, |r| r.path());
    let span =
        tracing::info_span!("request", request_id = app.request_id(), route = label, model = tracing::field::Empty);
    let verdict = app.guard.check(req.method(), marks.host.as_deref(), marks.origin.as_deref());
    let mut resp = async {
        match (route, verdict) {
            (Err(refused), _) => refused.response(),
            (Ok(route), Verdict::Pass) if preflight => preflight_answer(&app, route, &marks),
            (Ok(route), Verdict::Pass) if route.needs_key() && marks.key != KeyCheck::Pass => {
                key_refusal(route.shape(), marks.key)
            }
            (Ok(route), Verdict::Pass) => dispatch(&app, route, req).await,
            (Ok(route), refused) => guard_refusal(route.shape(), &refused),
        }
    }
    .instrument(span)
    .await;
    for (name, value) in app.guard.cors().response_headers(marks.origin.as_deref()) {
        if let Ok(v) = HeaderValue::from_str(&value) {
            // An engine's answer may vary by other headers too; the rest are ours alone.
            if name == "vary" {
                resp.headers_mut().append(name, v);
            } else {
                resp.headers_mut().insert(name, v);
            }
        }
    }
    app.stats.count(label, resp.status().as_u16());
    resp
}

/// A preflight: 204 with the CORS headers for a listed origin, else 403 without any.
fn preflight_answer(app: &App, route: Route, marks: &Marks) -> Response<Body> {
    let origin = marks.origin.as_deref().unwrap_or("");
    let Some(headers) = app.guard.cors().preflight(origin, route.allow(), marks.cors_headers.as_deref()) else {
        tracing::info!(origin, "preflight from an origin not listed with --allow-origin");
        let e = ApiError::new(
            ErrorKind::OriginNotAllowed,
            format!("origin {origin:?} may not call this server from a browser (see --allow-origin)"),
        );
        return respond::error(route.shape(), &e);
    };
    let mut r = Response::new(Body::Full(None));
    *r.status_mut() = http::StatusCode::NO_CONTENT;
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    r
}

/// A request without the API key, or with another one, in the route's error shape.
fn key_refusal(shape: ApiShape, check: KeyCheck) -> Response<Body> {
    let msg = match check {
        KeyCheck::Missing => "this server needs an API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        _ => "the API key is not this server's",
    };
    tracing::info!(reason = ?check, "request refused: API key");
    respond::error(shape, &ApiError::new(ErrorKind::InvalidApiKey, msg))
}

/// A request the guard refused, in the route's error shape.
fn guard_refusal(shape: ApiShape, v: &Verdict) -> Response<Body> {
    let e = match v {
        Verdict::MissingHost => ApiError::new(ErrorKind::MissingHost, "the request has no Host header"),
        Verdict::HostNotAllowed(h) => ApiError::new(
            ErrorKind::HostNotAllowed,
            format!("Host {h:?} does not name this server (allowed: localhost, 127.0.0.1, [::1] and --allow-host)"),
        ),
        Verdict::OriginNotAllowed(o) => {
            ApiError::new(ErrorKind::OriginNotAllowed, format!("a request from origin {o:?} may not change state here"))
        }
        Verdict::Pass => ApiError::new(ErrorKind::Internal, "refused without a reason"),
    };
    tracing::warn!(code = e.kind.code(), "request refused by the Host/Origin guard");
    respond::error(shape, &e)
}

async fn dispatch(app: &Arc<App>, route: Route, req: Request<Incoming>) -> Response<Body> {
    match route {
        Route::Health => respond::json(r#"{"status":"ok"}"#),
        Route::Engine => respond::json(serde_json::to_string(&monitor::engines_view(app)).unwrap_or_default()),
        Route::Models => respond::json(serde_json::to_string(&monitor::models(app)).unwrap_or_default()),
        Route::Stats => monitor::stats_route(app).await,
        Route::Metrics => monitor::metrics_route(app).await,
        Route::StoredResponse => stored_routes::by_id(app, req.method(), req.uri().path()),
        Route::Page => ui::page(req.headers()),
        Route::Asset => ui::asset(req.uri().path(), req.headers()),
        Route::LoadModel => model_controls::load(app, req.uri().path()).await,
        Route::UnloadModel => model_controls::unload(app, req.uri().path()).await,
        _ => {
            if app.stop.is_cancelled() {
                let e = ApiError::new(ErrorKind::ShuttingDown, "the server is shutting down");
                let mut r = respond::error(route.shape(), &e);
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
            // Counted from here until the response's last byte: shutdown waits on it.
            let guard = app.in_flight.enter();
            proxy::forward(app.clone(), route, req, guard).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_answers_errors_in_its_own_shape() {
        assert_eq!(Route::Messages.shape(), ApiShape::Anthropic);
        assert_eq!(Route::CountTokens.shape(), ApiShape::Anthropic);
        assert_eq!(Route::Responses.shape(), ApiShape::Responses);
        assert_eq!(Route::ChatCompletions.shape(), ApiShape::OpenAi);
        let r = Refused::Method { route: Route::Messages, method: Method::GET }.response();
        assert_eq!(r.status(), 405);
        let Body::Full(Some(b)) = r.into_body() else { panic!("a whole body") };
        assert!(b.starts_with(br#"{"type":"error""#), "{b:?}");
    }

    #[test]
    fn refusals_render_404_and_405_with_allow() {
        assert_eq!(Refused::NotFound("/x".into()).response().status(), 404);
        let r = Refused::Method { route: Route::Health, method: Method::POST }.response();
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()["allow"], "GET");
    }
}
