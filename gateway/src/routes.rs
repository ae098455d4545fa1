//! The gateway's routes, parsed once per request into a `Route`: which handler runs, the
//! method it allows, the label it is counted under, and the request's tracing span.
//! `/admin/*` exists only on engine sockets and is never served here.

use std::sync::Arc;

use corral_protocol::{ApiError, ErrorKind};
use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::app::App;
use crate::body::Body;
use crate::{monitor, proxy, respond};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Health,
    Engine,
    Stats,
    Models,
    ChatCompletions,
    Completions,
    /// A chat request's rendered prompt (`docs/api.md`), answered by the engine.
    ApplyTemplate,
}

const ALL: [Route; 7] = [
    Route::Health,
    Route::Engine,
    Route::Stats,
    Route::Models,
    Route::ChatCompletions,
    Route::Completions,
    Route::ApplyTemplate,
];

impl Route {
    pub fn path(self) -> &'static str {
        match self {
            Route::Health => "/health",
            Route::Engine => "/engine",
            Route::Stats => "/stats",
            Route::Models => "/v1/models",
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::ApplyTemplate => "/apply-template",
        }
    }

    pub fn method(self) -> Method {
        if self.proxied() { Method::POST } else { Method::GET }
    }

    /// Forwarded to the model's engine.
    pub fn proxied(self) -> bool {
        matches!(self, Route::ChatCompletions | Route::Completions | Route::ApplyTemplate)
    }

    pub fn parse(method: &Method, path: &str) -> Result<Route, Refused> {
        let route = ALL.into_iter().find(|r| r.path() == path).ok_or_else(|| Refused::NotFound(path.to_owned()))?;
        if *method != route.method() {
            return Err(Refused::Method { route, method: method.clone() });
        }
        Ok(route)
    }
}

/// A request no route takes.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    NotFound(String),
    Method { route: Route, method: Method },
}

impl Refused {
    /// Counted under the route's path when the path exists, else `other` (so the map of
    /// counters stays small whatever clients send).
    fn label(&self) -> &'static str {
        match self {
            Refused::NotFound(_) => "other",
            Refused::Method { route, .. } => route.path(),
        }
    }

    fn response(&self) -> Response<Body> {
        match self {
            Refused::NotFound(path) => respond::error(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
            Refused::Method { route, method } => {
                let msg = format!("{method} is not allowed on {}", route.path());
                let mut r = respond::error(&ApiError::new(ErrorKind::MethodNotAllowed, msg));
                let allow = if route.proxied() { "POST" } else { "GET" };
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
                r
            }
        }
    }
}

/// Every request enters here.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let route = Route::parse(req.method(), req.uri().path());
    let label = route.as_ref().map_or_else(Refused::label, |r| r.path());
    let span =
        tracing::info_span!("request", request_id = app.request_id(), route = label, model = tracing::field::Empty);
    let resp = async {
        match route {
            Err(refused) => refused.response(),
            Ok(route) => dispatch(&app, route, req).await,
        }
    }
    .instrument(span)
    .await;
    app.stats.count(label, resp.status().as_u16());
    resp
}

async fn dispatch(app: &Arc<App>, route: Route, req: Request<Incoming>) -> Response<Body> {
    match route {
        Route::Health => respond::json(r#"{"status":"ok"}"#),
        Route::Engine => respond::json(serde_json::to_string(&app.pool.snapshot()).unwrap_or_default()),
        Route::Models => respond::json(serde_json::to_string(&app.pool.models()).unwrap_or_default()),
        Route::Stats => monitor::stats_route(app).await,
        Route::ChatCompletions | Route::Completions | Route::ApplyTemplate => {
            if app.stop.is_cancelled() {
                let mut r = respond::error(&ApiError::new(ErrorKind::ShuttingDown, "the server is shutting down"));
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
            // Counted from here until the response's last byte: shutdown waits on it.
            let guard = app.in_flight.enter();
            proxy::forward(app.clone(), req, guard).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_parses_with_its_method_only() {
        for r in ALL {
            assert_eq!(Route::parse(&r.method(), r.path()), Ok(r));
            let other = if r.method() == Method::GET { Method::POST } else { Method::GET };
            assert_eq!(Route::parse(&other, r.path()), Err(Refused::Method { route: r, method: other.clone() }));
        }
        for path in ["/admin/drain", "/admin/stats", "/", "/v1/chat/completions/"] {
            assert_eq!(Route::parse(&Method::GET, path), Err(Refused::NotFound(path.to_owned())), "{path}");
        }
        assert!(Route::ChatCompletions.proxied() && !Route::Stats.proxied());
    }

    #[test]
    fn refusals_render_404_and_405_with_allow() {
        assert_eq!(Refused::NotFound("/x".into()).response().status(), 404);
        let r = Refused::Method { route: Route::Health, method: Method::POST }.response();
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()["allow"], "GET");
    }
}
