//! Routing and handlers of the engine's HTTP API. Every error response, before or
//! after a stream starts, is rendered by `protocol`'s error rendering (through
//! `corral_net::respond` and `ApiError::sse_event`). Parsing, template rendering and
//! tokenization run on the blocking pool, never on the I/O thread, so a huge prompt does
//! not delay `/health` or `/admin/drain`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use corral_protocol::anthropic::{MessagesRequest, TokenCount};
use corral_protocol::http_limits::BODY_IDLE_TIMEOUT;
use corral_protocol::openai::{Capabilities, GenDefaults, ModelCard, ModelList};
use corral_protocol::responses::ResponsesRequest;
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::admin;
use super::anthropic::{self, AnthropicRender};
use super::app::App;
use super::body::Body;
use super::input;
use super::openai_chat::{Meta, OpenAiRender, Route};
use super::requests::{self, Validated};
use super::respond::{error_response, error_response_in, json_response};
use super::responses_api::{self, ResponsesRender};
use super::stream;
use crate::chat::TemplateSource;
use crate::scheduler::admission;
use crate::scheduler::worker::{Event, Job};

/// The engine's operations, parsed once per request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Health,
    Models,
    AdminStats,
    AdminDrain,
    AdminFlush,
    ApplyTemplate,
    CountTokens,
    Generate(Api),
}

/// The generation APIs, each with its request shape, renderer and error shape.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Api {
    Chat,
    Completion,
    Messages,
    Responses,
}

impl Api {
    fn shape(self) -> ApiShape {
        match self {
            Api::Chat | Api::Completion => ApiShape::OpenAi,
            Api::Messages => ApiShape::Anthropic,
            Api::Responses => ApiShape::Responses,
        }
    }
}

impl Op {
    /// The operation, or the refusal and the method to name in `Allow`.
    fn parse(method: &Method, path: &str) -> Result<Op, (ApiError, Option<&'static str>)> {
        let (op, allowed) = match path {
            "/health" => (Op::Health, Method::GET),
            "/v1/models" => (Op::Models, Method::GET),
            "/admin/stats" => (Op::AdminStats, Method::GET),
            "/admin/drain" => (Op::AdminDrain, Method::POST),
            "/admin/cache/flush" => (Op::AdminFlush, Method::POST),
            "/apply-template" => (Op::ApplyTemplate, Method::POST),
            "/v1/chat/completions" => (Op::Generate(Api::Chat), Method::POST),
            "/v1/completions" => (Op::Generate(Api::Completion), Method::POST),
            "/v1/messages" => (Op::Generate(Api::Messages), Method::POST),
            "/v1/messages/count_tokens" => (Op::CountTokens, Method::POST),
            "/v1/responses" => (Op::Generate(Api::Responses), Method::POST),
            _ => return Err((ApiError::new(ErrorKind::NotFound, format!("no route {path}")), None)),
        };
        if *method != allowed {
            let e = ApiError::new(ErrorKind::MethodNotAllowed, format!("{method} is not allowed on {path}"));
            return Err((e, Some(if allowed == Method::GET { "GET" } else { "POST" })));
        }
        Ok(op)
    }
}

pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    use tracing::Instrument;
    let span = tracing::info_span!("request", route = %req.uri().path(), model = %app.model_id);
    route(app, req).instrument(span).await
}

async fn route(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let op = match Op::parse(req.method(), req.uri().path()) {
        Ok(op) => op,
        Err((e, allow)) => {
            let mut r = error_response(&e);
            if let Some(allow) = allow {
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            return r;
        }
    };
    match op {
        Op::Health => json_response(r#"{"status":"ok"}"#),
        Op::Models => json_response(serde_json::to_string(&models(&app)).unwrap_or_default()),
        Op::AdminStats => admin::stats(&app),
        Op::AdminDrain => admin::drain(&app, &req).await,
        Op::AdminFlush => admin::flush(&app).await,
        Op::ApplyTemplate => apply_template(app, req).await,
        Op::CountTokens => count_tokens(app, req).await,
        Op::Generate(api) => generate(app.clone(), req, api).await,
    }
}

fn models(app: &App) -> ModelList {
    let d = &app.defaults;
    let template = app.engine.template.as_ref().map(|t| match t.source() {
        TemplateSource::Gguf => "gguf".to_owned(),
        TemplateSource::Builtin(n) => format!("builtin:{n}"),
        TemplateSource::File => "file".to_owned(),
    });
    ModelList {
        object: "list".into(),
        data: vec![
            ModelCard {
                context_window: Some(app.ctx),
                gen_defaults: Some(GenDefaults {
                    temperature: d.sampling.temperature,
                    top_p: d.sampling.top_p,
                    top_k: d.sampling.top_k,
                    min_p: d.sampling.min_p,
                    max_tokens: d.max_tokens,
                }),
                arch: Some(app.engine.config().arch.name().to_owned()),
                batch_mode: Some(if app.batch > 1 { "continuous" } else { "serial" }.to_owned()),
                chat_template: template,
                ..ModelCard::new(app.model_id.clone(), app.created)
            }
            .with_capabilities(Capabilities::of_engine(app.engine.template.is_some())),
        ],
    }
}

/// Parse a request body; every failure is a 4xx naming the field at fault. Bodies are
/// JSON objects: serde would read a request struct from an array too (fields by
/// position), which no client means and the gateway does not read.
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::new(ErrorKind::InvalidRequest, "request body: must be a JSON object, not an array"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() && path == "." {
            ApiError::new(ErrorKind::InvalidRequest, format!("request body: {inner}"))
        } else if inner.is_data() {
            ApiError::invalid(&path, format!("{path}: {inner}"))
        } else {
            ApiError::new(ErrorKind::InvalidJson, format!("invalid JSON: {inner}"))
        }
    })?;
    de.end().map_err(|e| ApiError::new(ErrorKind::InvalidJson, format!("invalid JSON: {e}")))?;
    Ok(v)
}

/// What validation hands on to rendering.
enum Parsed {
    OpenAi(Route),
    Messages,
    Responses(Box<ResponsesRequest>),
}

/// Parse, render the chat template and tokenize: CPU work proportional to the prompt.
/// `expanded`: the gateway sent a Responses request's whole history.
fn validate(app: &App, api: Api, bytes: &[u8], expanded: bool) -> Result<(Validated, Parsed), ApiError> {
    let (e, d, ctx) = (&app.engine, &app.defaults, app.ctx);
    Ok(match api {
        Api::Chat => (input::chat(input::from_openai(&parse_json(bytes)?)?, e, d, ctx)?, Parsed::OpenAi(Route::Chat)),
        Api::Completion => (requests::completion(&parse_json(bytes)?, e, d, ctx)?, Parsed::OpenAi(Route::Completion)),
        Api::Messages => (input::chat(anthropic::input(&parse_json(bytes)?)?, e, d, ctx)?, Parsed::Messages),
        Api::Responses => {
            let req: ResponsesRequest = parse_json(bytes)?;
            (input::chat(responses_api::input(&req, expanded)?, e, d, ctx)?, Parsed::Responses(Box::new(req)))
        }
    })
}

async fn generate(app: Arc<App>, req: Request<Incoming>, api: Api) -> Response<Body> {
    let arrived = std::time::Instant::now();
    app.stats.requests_total.fetch_add(1, Ordering::Relaxed);
    let shape = api.shape();
    // Counted before the drain flag is read, so a drain never misses an admitted request.
    let work = app.work.enter();
    if app.draining.load(Ordering::SeqCst) {
        return error_response_in(&ApiError::new(ErrorKind::EngineDraining, "the engine is draining; retry"), shape);
    }
    let failed = |app: &App, e: &ApiError| {
        app.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
        error_response_in(e, shape)
    };
    let expanded = req.headers().contains_key(corral_protocol::responses::HISTORY_HEADER);
    let bytes = match corral_net::body::read_limited(req, app.max_body_bytes, BODY_IDLE_TIMEOUT).await {
        Ok((_, b)) => b,
        Err(e) => return failed(&app, &e.into()),
    };
    let job_app = app.clone();
    let validated = tokio::task::spawn_blocking(move || validate(&job_app, api, &bytes, expanded))
        .await
        .unwrap_or_else(|e| Err(ApiError::new(ErrorKind::Internal, format!("request validation failed: {e}"))));
    let (Validated { prompt, mut params, stream, include_usage, mut warnings, reading, rendered: _ }, parsed) =
        match validated {
            Ok(v) => v,
            Err(e) => return failed(&app, &e),
        };
    let prompt_tokens = prompt.len();
    let admitted = match admission::admit(prompt_tokens, params.max_tokens, app.ctx, &app.kv_budget) {
        Ok(a) => a,
        Err(e) => return failed(&app, &ApiError::from(&e)),
    };
    params.max_tokens = admitted.max_tokens;
    warnings.extend(admitted.warning);
    let (events, rx) = mpsc::unbounded_channel();
    if let Err(e) = app.worker.submit(Job { prompt, params, events, kv_bytes: admitted.kv_bytes, arrived }) {
        return failed(&app, &ApiError::from(&e));
    }
    let mut r = match parsed {
        Parsed::OpenAi(route) => {
            let render = OpenAiRender::new(Meta::new(route, &app.model_id), app.engine.clone(), include_usage);
            respond(render, stream, rx, reading, work).await
        }
        Parsed::Messages => {
            respond(AnthropicRender::new(&app.model_id, prompt_tokens), stream, rx, reading, work).await
        }
        Parsed::Responses(req) => {
            let engine = app.engine.clone();
            let count = Box::new(move |t: &str| engine.tokenizer.encode(t, false).map_or(0, |ids| ids.len()));
            respond(ResponsesRender::new(&app.model_id, &req, count), stream, rx, reading, work).await
        }
    };
    for w in &warnings {
        r.headers_mut().append(header::WARNING, warning_header(w));
    }
    r
}

async fn respond(
    render: impl stream::Render,
    streamed: bool,
    rx: mpsc::UnboundedReceiver<Event>,
    reading: super::answer::Reading,
    work: corral_net::gauge::Guard,
) -> Response<Body> {
    if streamed { stream::streaming(render, rx, reading, work) } else { stream::whole(render, rx, reading).await }
}

/// `POST /v1/messages/count_tokens`: the prompt a Messages request renders to, counted.
async fn count_tokens(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let shape = ApiShape::Anthropic;
    let bytes = match corral_net::body::read_limited(req, app.max_body_bytes, BODY_IDLE_TIMEOUT).await {
        Ok((_, b)) => b,
        Err(e) => return error_response_in(&e.into(), shape),
    };
    let job_app = app.clone();
    let counted = tokio::task::spawn_blocking(move || -> Result<usize, ApiError> {
        let req: MessagesRequest = parse_json(&bytes)?;
        let input = anthropic::input(&anthropic::count_request(&req))?;
        Ok(input::chat(input, &job_app.engine, &job_app.defaults, job_app.ctx)?.prompt.len())
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::new(ErrorKind::Internal, format!("counting failed: {e}"))));
    match counted {
        Ok(n) => json_response(serde_json::to_string(&TokenCount { input_tokens: n }).unwrap_or_default()),
        Err(e) => error_response_in(&e, shape),
    }
}

/// `Warning: 299 - "<what is not honoured: why>"` (RFC 7234's miscellaneous persistent
/// warning), e.g. `grammar not enforced: …`, reduced to what a header may carry.
fn warning_header(reason: &str) -> HeaderValue {
    let words: Vec<String> = reason
        .split_whitespace()
        .map(|w| w.chars().filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\').collect())
        .filter(|w: &String| !w.is_empty())
        .collect();
    let clean: String = words.join(" ").chars().take(300).collect();
    HeaderValue::from_str(&format!("299 - \"{clean}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("299 - \"not honoured\""))
}

/// `POST /apply-template` (as llama.cpp's server): the prompt a chat request renders
/// to, with the tool prompt and any unenforced-constraint instruction in it.
async fn apply_template(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let bytes = match corral_net::body::read_limited(req, app.max_body_bytes, BODY_IDLE_TIMEOUT).await {
        Ok((_, b)) => b,
        Err(e) => return error_response(&e.into()),
    };
    let job_app = app.clone();
    let v = tokio::task::spawn_blocking(move || validate(&job_app, Api::Chat, &bytes, false).map(|v| v.0))
        .await
        .unwrap_or_else(|e| Err(ApiError::new(ErrorKind::Internal, format!("request validation failed: {e}"))));
    match v {
        Ok(v) => json_response(
            serde_json::json!({"prompt": v.rendered, "prompt_tokens": v.prompt.len(), "warnings": v.warnings})
                .to_string(),
        ),
        Err(e) => error_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found with the request fuzz targets (the gateway reads objects only): a request
    /// struct was read from a JSON array, its fields by position.
    #[test]
    fn bodies_are_objects() {
        let e = parse_json::<MessagesRequest>(br#" ["m", 5, [{"role": "user", "content": "Hi"}]]"#).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(e.message.contains("JSON object"), "{}", e.message);
        assert!(parse_json::<MessagesRequest>(br#"{"model": "m", "max_tokens": 5}"#).is_ok());
        assert_eq!(parse_json::<MessagesRequest>(b"{").unwrap_err().kind, ErrorKind::InvalidJson);
    }
}
