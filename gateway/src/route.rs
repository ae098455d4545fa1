//! The gateway's route table: which paths exist, the methods each takes, the API shape
//! its errors are written in and the label it is counted under. Pure: a path and a
//! method in, a `Route` (or why none) out. What runs for each route is `routes.rs`;
//! the handlers take their route's constants from here, so imports run one way.

use corral_protocol::ApiShape;
use http::Method;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Health,
    Engine,
    Stats,
    /// `GET /metrics`: the Prometheus text format.
    Metrics,
    Models,
    ChatCompletions,
    Completions,
    /// A chat request's rendered prompt (`docs/api.md`), answered by the engine.
    ApplyTemplate,
    /// Anthropic Messages.
    Messages,
    CountTokens,
    /// OpenAI Responses (stored responses and `previous_response_id` are handled here).
    Responses,
    /// `GET`/`DELETE /v1/responses/{id}`: the gateway's store, no engine involved.
    StoredResponse,
    /// `GET /`: the web UI's page.
    Page,
    /// `GET /ui/{file}`: the UI's scripts and styles.
    Asset,
    /// `POST /api/models/{id}/load`: start a model's engine and wait until it is ready.
    LoadModel,
    /// `POST /api/models/{id}/unload`: stop a model's engine through the stop path.
    UnloadModel,
}

/// Every route, in the order the route table is read.
pub const ALL: [Route; 16] = [
    Route::Health,
    Route::Engine,
    Route::Stats,
    Route::Metrics,
    Route::Models,
    Route::ChatCompletions,
    Route::Completions,
    Route::ApplyTemplate,
    Route::Messages,
    Route::CountTokens,
    Route::Responses,
    Route::StoredResponse,
    Route::Page,
    Route::Asset,
    Route::LoadModel,
    Route::UnloadModel,
];

/// Where stored responses are addressed: `/v1/responses/{id}`.
const STORED_PREFIX: &str = "/v1/responses/";
/// Where the UI's files are: `/ui/{file}`.
pub const ASSET_PREFIX: &str = "/ui/";
/// Where a model is loaded and unloaded: `/api/models/{id}/load|unload`.
pub const MODELS_PREFIX: &str = "/api/models/";

/// One non-empty path segment (an id or a file name: no `/`).
fn segment(s: &str) -> bool {
    !s.is_empty() && !s.contains('/')
}

/// Routes whose path carries a parameter.
fn templated(path: &str) -> Option<Route> {
    if path.strip_prefix(STORED_PREFIX).is_some_and(segment) {
        return Some(Route::StoredResponse);
    }
    if path.strip_prefix(ASSET_PREFIX).is_some_and(segment) {
        return Some(Route::Asset);
    }
    let rest = path.strip_prefix(MODELS_PREFIX)?;
    if rest.strip_suffix("/load").is_some_and(segment) {
        Some(Route::LoadModel)
    } else if rest.strip_suffix("/unload").is_some_and(segment) {
        Some(Route::UnloadModel)
    } else {
        None
    }
}

impl Route {
    pub fn path(self) -> &'static str {
        match self {
            Route::Health => "/health",
            Route::Engine => "/engine",
            Route::Stats => "/stats",
            Route::Metrics => "/metrics",
            Route::Models => "/v1/models",
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::ApplyTemplate => "/apply-template",
            Route::Messages => "/v1/messages",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Responses => "/v1/responses",
            // The label it is counted under; the id is not part of it.
            Route::StoredResponse => "/v1/responses/{id}",
            Route::Page => "/",
            Route::Asset => "/ui/{file}",
            Route::LoadModel => "/api/models/{id}/load",
            Route::UnloadModel => "/api/models/{id}/unload",
        }
    }

    /// The `Allow` header: the methods the route takes.
    pub fn allow(self) -> &'static str {
        match self {
            _ if self.proxied() => "POST",
            Route::LoadModel | Route::UnloadModel => "POST",
            Route::StoredResponse => "GET, DELETE",
            _ => "GET",
        }
    }

    pub fn allows(self, method: &Method) -> bool {
        self.methods().any(|m| m == method.as_str())
    }

    /// The methods the route takes, one by one.
    pub fn methods(self) -> impl Iterator<Item = &'static str> {
        self.allow().split(", ")
    }

    /// Forwarded to the model's engine.
    pub fn proxied(self) -> bool {
        matches!(
            self,
            Route::ChatCompletions
                | Route::Completions
                | Route::ApplyTemplate
                | Route::Messages
                | Route::CountTokens
                | Route::Responses
        )
    }

    /// The wire shape of the errors this route answers with.
    pub fn shape(self) -> ApiShape {
        match self {
            Route::Messages | Route::CountTokens => ApiShape::Anthropic,
            Route::Responses | Route::StoredResponse => ApiShape::Responses,
            _ => ApiShape::OpenAi,
        }
    }

    /// Whether the API key (when one is set) is needed: everywhere but the health check
    /// and the UI's own files, which hold no data (the page asks for the key itself).
    pub fn needs_key(self) -> bool {
        !matches!(self, Route::Health | Route::Page | Route::Asset)
    }

    /// Whether the path has a parameter in it (`{id}`, `{file}`).
    fn templated(self) -> bool {
        self.path().contains('{')
    }

    pub fn parse(method: &Method, path: &str) -> Result<Route, Refused> {
        let route = match templated(path) {
            Some(r) => r,
            None => ALL
                .into_iter()
                .find(|r| !r.templated() && r.path() == path)
                .ok_or_else(|| Refused::NotFound(path.to_owned()))?,
        };
        if !route.allows(method) {
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
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refused::NotFound(_) => "other",
            Refused::Method { route, .. } => route.path(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_parses_with_its_method_only() {
        for r in ALL.into_iter().filter(|r| !r.templated()) {
            let method = if r.proxied() { Method::POST } else { Method::GET };
            assert_eq!(Route::parse(&method, r.path()), Ok(r));
            let other = if r.proxied() { Method::GET } else { Method::POST };
            assert_eq!(Route::parse(&other, r.path()), Err(Refused::Method { route: r, method: other.clone() }));
        }
        for path in [
            "/admin/drain",
            "/admin/stats",
            "/index.html",
            "/v1/chat/completions/",
            "/v1/responses/",
            "/v1/responses/a/b",
            "/ui/",
            "/ui/a/b.js",
            "/api/models/load",
            "/api/models//load",
            "/api/models/a/b/load",
            "/api/models/a/start",
        ] {
            assert_eq!(Route::parse(&Method::GET, path), Err(Refused::NotFound(path.to_owned())), "{path}");
        }
        assert!(Route::ChatCompletions.proxied() && !Route::Stats.proxied() && !Route::StoredResponse.proxied());
        assert_eq!(Route::parse(&Method::GET, "/metrics"), Ok(Route::Metrics));
    }

    #[test]
    fn stored_responses_take_get_and_delete_by_id() {
        for m in [Method::GET, Method::DELETE] {
            assert_eq!(Route::parse(&m, "/v1/responses/resp_1"), Ok(Route::StoredResponse));
        }
        assert!(matches!(Route::parse(&Method::POST, "/v1/responses/resp_1"), Err(Refused::Method { .. })));
        assert_eq!(Route::parse(&Method::POST, "/v1/responses"), Ok(Route::Responses));
        assert_eq!(Route::StoredResponse.allow(), "GET, DELETE");
    }

    #[test]
    fn ui_files_and_model_controls_take_their_parameter_and_method() {
        assert_eq!(Route::parse(&Method::GET, "/"), Ok(Route::Page));
        assert_eq!(Route::parse(&Method::GET, "/ui/app.js"), Ok(Route::Asset));
        assert!(matches!(Route::parse(&Method::POST, "/ui/app.js"), Err(Refused::Method { .. })));
        assert_eq!(Route::parse(&Method::POST, "/api/models/smol/load"), Ok(Route::LoadModel));
        assert_eq!(Route::parse(&Method::POST, "/api/models/gemma-3.q4_k_m/unload"), Ok(Route::UnloadModel));
        let get = Route::parse(&Method::GET, "/api/models/smol/load");
        assert_eq!(get, Err(Refused::Method { route: Route::LoadModel, method: Method::GET }));
        assert_eq!(Route::LoadModel.path(), "/api/models/{id}/load", "counted without the id");
    }
}
