//! `POST /api/models/{id}/load` and `/unload`: the engines page's buttons, on the pool's
//! `load`/`unload`. Each answers with that model's entry of `/engine` once the action is
//! done (ready, or stopped); errors are the pool's, rendered by the one error site in the
//! OpenAI shape (an unknown id is 404 `model_not_found`).

use std::sync::Arc;

use corral_pool::view::EngineView;
use corral_protocol::{ApiError, ApiShape};
use http::Response;

use crate::app::App;
use crate::body::Body;
use crate::respond;
use crate::route::MODELS_PREFIX;

/// The `{id}` of `/api/models/{id}/<action>` (the route table has checked the shape).
fn model_of(path: &str) -> &str {
    let rest = path.strip_prefix(MODELS_PREFIX).unwrap_or(path);
    rest.rsplit_once('/').map_or(rest, |(id, _)| id)
}

fn engine_view(app: &App, model: &str) -> Option<EngineView> {
    app.pool.snapshot().engines.into_iter().find(|e| e.model == model)
}

fn answer(app: &App, model: &str, result: Result<(), corral_pool::LeaseError>) -> Response<Body> {
    match result.map(|()| engine_view(app, model)) {
        Ok(Some(view)) => respond::json(serde_json::to_string(&view).unwrap_or_default()),
        // The pool knew the id a moment ago; its models never change at run time.
        Ok(None) => {
            respond::error(ApiShape::OpenAi, &ApiError::new(corral_protocol::ErrorKind::Internal, "model vanished"))
        }
        Err(e) => {
            tracing::warn!(model, error = %e, "model control refused");
            respond::error(ApiShape::OpenAi, &ApiError::from(e))
        }
    }
}

/// An upstream model is neither loaded nor unloaded here: its servers are not ours.
fn upstream_refusal(app: &App, model: &str) -> Option<Response<Body>> {
    let up = app.upstreams.find(model)?;
    let e = ApiError::new(
        corral_protocol::ErrorKind::InvalidRequest,
        format!("model {} is served by an upstream server; corral does not load or unload it", up.id()),
    )
    .with_param("model");
    Some(respond::error(ApiShape::OpenAi, &e))
}

pub async fn load(app: &Arc<App>, path: &str) -> Response<Body> {
    let model = model_of(path);
    tracing::Span::current().record("model", model);
    if let Some(r) = upstream_refusal(app, model) {
        return r;
    }
    let t = std::time::Instant::now();
    let result = app.pool.load(model).await;
    if result.is_ok() {
        tracing::info!(model, took_ms = t.elapsed().as_millis() as u64, "model loaded on request");
    }
    answer(app, model, result)
}

pub async fn unload(app: &Arc<App>, path: &str) -> Response<Body> {
    let model = model_of(path);
    tracing::Span::current().record("model", model);
    if let Some(r) = upstream_refusal(app, model) {
        return r;
    }
    let t = std::time::Instant::now();
    let result = app.pool.unload(model).await;
    if let Ok(state) = &result {
        tracing::info!(model, state = ?state, took_ms = t.elapsed().as_millis() as u64, "model unloaded on request");
    }
    answer(app, model, result.map(drop))
}

#[cfg(test)]
mod tests {
    use super::model_of;

    #[test]
    fn the_id_is_the_segment_between_the_prefix_and_the_action() {
        assert_eq!(model_of("/api/models/smol/load"), "smol");
        assert_eq!(model_of("/api/models/gemma-3-270m-q4_k_m/unload"), "gemma-3-270m-q4_k_m");
    }
}
