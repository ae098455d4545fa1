//! Routing and handlers of the engine's HTTP API. Every error response, before or
//! after a stream starts, is rendered by `protocol`'s error rendering (through
//! `corral_net::respond` and `responses::sse_error`). Parsing, template rendering and
//! tokenization run on the blocking pool, never on the I/O thread, so a huge prompt does
//! not delay `/health` or `/admin/drain`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_net::gauge::{Gauge, Guard};
use corral_protocol::openai::{Capabilities, GenDefaults, ModelCard, ModelList};
use corral_protocol::{ApiError, ApiShape, ErrorKind};
use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::admin;
use super::answer::{AnswerPiece, Reading};
use super::body::Body;
use super::requests::{self, EffectiveDefaults, Validated};
use super::responses::{self, ChunkKind, Meta, Route};
use super::stats::Stats;
use super::worker::{Event, Job, Worker};
use crate::Engine;
use crate::chat::TemplateSource;
use crate::generate::{FinishReason, TokenOut};

pub struct App {
    pub engine: Arc<Engine>,
    pub worker: Worker,
    pub cache: Arc<crate::cache::PromptCache>,
    pub stats: Arc<Stats>,
    pub model_id: String,
    pub ctx: usize,
    pub max_queue: usize,
    pub max_body_bytes: usize,
    pub defaults: EffectiveDefaults,
    pub created: u64,
    pub default_drain: Duration,
    /// Set once a drain begins: generation requests are refused from then on.
    pub draining: AtomicBool,
    /// Generation requests admitted and not yet answered (a drain waits on it).
    pub work: Arc<Gauge>,
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    corral_net::respond::error_response(e, ApiShape::OpenAi)
}

pub fn json_response(body: impl Into<Bytes>) -> Response<Body> {
    corral_net::respond::json_response(body)
}

/// The engine's operations, parsed once per request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Health,
    Models,
    AdminStats,
    AdminDrain,
    AdminFlush,
    ApplyTemplate,
    Generate(Route),
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
            "/v1/chat/completions" => (Op::Generate(Route::Chat), Method::POST),
            "/v1/completions" => (Op::Generate(Route::Completion), Method::POST),
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
        Op::Generate(route) => generate(app.clone(), req, route).await,
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
        data: vec![ModelCard {
            id: app.model_id.clone(),
            object: "model".into(),
            created: app.created,
            owned_by: "corral".into(),
            context_window: Some(app.ctx),
            capabilities: Some(Capabilities {
                chat_completions: app.engine.template.is_some(),
                text_completions: true,
                streaming: true,
                logprobs: true,
                tools: app.engine.template.is_some(),
                structured_output: true,
                vision: false,
                embeddings: false,
            }),
            gen_defaults: Some(GenDefaults {
                temperature: d.sampling.temperature,
                top_p: d.sampling.top_p,
                top_k: d.sampling.top_k,
                min_p: d.sampling.min_p,
                max_tokens: d.max_tokens,
            }),
            resident: None,
            arch: Some(app.engine.config().arch.name().to_owned()),
            chat_template: template,
        }],
    }
}

/// Parse a request body; every failure is a 4xx naming the field at fault.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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

/// Parse, render the chat template and tokenize: CPU work proportional to the prompt.
fn validate(app: &App, route: Route, bytes: &[u8]) -> Result<Validated, ApiError> {
    match route {
        Route::Chat => requests::chat(&parse_json(bytes)?, &app.engine, &app.defaults, app.ctx),
        Route::Completion => requests::completion(&parse_json(bytes)?, &app.engine, &app.defaults, app.ctx),
    }
}

async fn generate(app: Arc<App>, req: Request<Incoming>, route: Route) -> Response<Body> {
    app.stats.requests_total.fetch_add(1, Ordering::Relaxed);
    // Counted before the drain flag is read, so a drain never misses an admitted request.
    let work = app.work.enter();
    if app.draining.load(Ordering::SeqCst) {
        return error_response(&ApiError::new(ErrorKind::EngineDraining, "the engine is draining; retry"));
    }
    let failed = |app: &App, e: &ApiError| {
        app.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
        error_response(e)
    };
    let bytes = match corral_net::body::read_limited(req, app.max_body_bytes).await {
        Ok((_, b)) => b,
        Err(e) => return failed(&app, &e.into()),
    };
    let job_app = app.clone();
    let validated = tokio::task::spawn_blocking(move || validate(&job_app, route, &bytes))
        .await
        .unwrap_or_else(|e| Err(ApiError::new(ErrorKind::Internal, format!("request validation failed: {e}"))));
    let Validated { prompt, params, stream, include_usage, warnings, reading, rendered: _ } = match validated {
        Ok(v) => v,
        Err(e) => return failed(&app, &e),
    };
    let (events, rx) = mpsc::channel(64);
    if let Err(e) = app.worker.submit(Job { prompt, params, events }) {
        return failed(&app, &e);
    }
    let meta = Meta::new(route, &app.model_id);
    let mut r = if stream {
        stream_response(app, meta, rx, include_usage, reading, work)
    } else {
        whole_response(app, meta, rx, reading).await
    };
    for w in &warnings {
        r.headers_mut().append(header::WARNING, warning_header(w));
    }
    r
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
    let bytes = match corral_net::body::read_limited(req, app.max_body_bytes).await {
        Ok((_, b)) => b,
        Err(e) => return error_response(&e.into()),
    };
    let job_app = app.clone();
    let v = tokio::task::spawn_blocking(move || validate(&job_app, Route::Chat, &bytes))
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

async fn whole_response(app: Arc<App>, meta: Meta, mut rx: mpsc::Receiver<Event>, reading: Reading) -> Response<Body> {
    let mut text = String::new();
    let mut lp: Vec<TokenOut> = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t) => {
                text.push_str(&t.text);
                if t.logprob.is_some() {
                    lp.push(t);
                }
            }
            Event::Flush(t) => text.push_str(&t),
            Event::Done(o) if o.finish == FinishReason::Cancelled => return error_response(&cut()),
            Event::Done(o) => {
                let answer = reading.read(&text);
                let body = responses::final_body(&meta, text, answer, &o, &lp, &app.engine.tokenizer);
                return json_response(body);
            }
            Event::Failed(e) => return error_response(&e),
        }
    }
    error_response(&ApiError::new(ErrorKind::Internal, "the generation thread went away"))
}

/// A request cut by a drain deadline or shutdown (a client that left sees nothing).
fn cut() -> ApiError {
    ApiError::new(ErrorKind::EngineDraining, "the request was cut short: the engine is stopping")
}

fn stream_response(
    app: Arc<App>,
    meta: Meta,
    mut rx: mpsc::Receiver<Event>,
    include_usage: bool,
    reading: Reading,
    work: Guard,
) -> Response<Body> {
    let (tx, body) = Body::channel(16);
    tokio::spawn(async move {
        // The request counts as work until its last event is handed to the body.
        let _work = work;
        let tok = &app.engine.tokenizer;
        let mut offset = 0usize;
        // Chat answers are read as they come (reasoning, text, tool calls); completions
        // stream their text as generated.
        let mut answer = (meta.route == Route::Chat).then(|| reading.stream());
        let started = Instant::now();
        if meta.route == Route::Chat && tx.send(responses::chunk(&meta, ChunkKind::Role, tok)).await.is_err() {
            return;
        }
        loop {
            // Waiting on both: a client that leaves during prefill closes `tx`, and
            // dropping `rx` then tells the generation thread to stop.
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = tx.closed() => return,
            };
            let frames = match ev {
                Some(Event::Token(t)) if t.text.is_empty() && t.logprob.is_none() => continue,
                Some(Event::Token(t)) if answer.is_some() => {
                    let pieces = answer.as_mut().map(|a| a.push(&t.text)).unwrap_or_default();
                    piece_frames(&meta, tok, pieces, Some(&t))
                }
                Some(Event::Token(t)) => {
                    let c = responses::chunk(&meta, ChunkKind::Text { text: &t.text, lp: Some(&t), offset }, tok);
                    offset += t.text.len();
                    vec![c]
                }
                Some(Event::Flush(t)) if answer.is_some() => {
                    let pieces = answer.as_mut().map(|a| a.push(&t)).unwrap_or_default();
                    piece_frames(&meta, tok, pieces, None)
                }
                Some(Event::Flush(t)) => {
                    vec![responses::chunk(&meta, ChunkKind::Text { text: &t, lp: None, offset }, tok)]
                }
                Some(Event::Done(o)) if o.finish == FinishReason::Cancelled => {
                    let _ = tx.send(responses::sse_error(&cut())).await;
                    return;
                }
                Some(Event::Done(o)) => {
                    let mut frames = match answer.as_mut() {
                        Some(a) => piece_frames(&meta, tok, a.finish(), None),
                        None => Vec::new(),
                    };
                    let made_calls = answer.as_ref().is_some_and(|a| a.calls() > 0);
                    frames.push(responses::chunk(&meta, ChunkKind::Finish(responses::finish_str(&o, made_calls)), tok));
                    if include_usage {
                        frames.push(responses::chunk(&meta, ChunkKind::Usage(responses::usage(&o)), tok));
                    }
                    frames.push(responses::sse_done());
                    for f in frames {
                        if tx.send(f).await.is_err() {
                            return;
                        }
                    }
                    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "stream done");
                    return;
                }
                Some(Event::Failed(e)) => {
                    let _ = tx.send(responses::sse_error(&e)).await;
                    return;
                }
                None => {
                    let _ = tx
                        .send(responses::sse_error(&ApiError::new(
                            ErrorKind::Internal,
                            "the generation thread went away",
                        )))
                        .await;
                    return;
                }
            };
            for frame in frames {
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// The chunks of an answer's pieces; a token's logprobs ride on its first text chunk
/// (or on an empty one, when the token released no text yet).
fn piece_frames(
    meta: &Meta,
    tok: &crate::tokenizer::Tokenizer,
    pieces: Vec<AnswerPiece>,
    lp: Option<&TokenOut>,
) -> Vec<Bytes> {
    let mut lp = lp.filter(|t| t.logprob.is_some());
    let mut frames: Vec<Bytes> = pieces
        .iter()
        .map(|p| match p {
            AnswerPiece::Text(text) => responses::chunk(meta, ChunkKind::Text { text, lp: lp.take(), offset: 0 }, tok),
            AnswerPiece::Reasoning(text) => responses::chunk(meta, ChunkKind::Reasoning(text), tok),
            AnswerPiece::CallStart { index, name } => {
                responses::chunk(meta, ChunkKind::Call(responses::call_start(*index, name)), tok)
            }
            AnswerPiece::CallArgs { index, fragment } => {
                responses::chunk(meta, ChunkKind::Call(responses::call_args(*index, fragment)), tok)
            }
        })
        .collect();
    if let Some(t) = lp {
        frames.push(responses::chunk(meta, ChunkKind::Text { text: "", lp: Some(t), offset: 0 }, tok));
    }
    frames
}
