//! Routing and handlers of the engine's HTTP API. Every error response, before or
//! after a stream starts, goes through `error_response` / `responses::sse_error`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corral_protocol::engine_wire::DrainResponse;
use corral_protocol::openai::{Capabilities, GenDefaults, ModelCard, ModelList};
use corral_protocol::{ApiError, ErrorKind};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::body::Body;
use super::requests::{self, EffectiveDefaults, ToolOutput, Validated};
use super::responses::{self, ChunkKind, Meta, Route};
use super::stats::Stats;
use super::worker::{Event, Job, Worker};
use crate::Engine;
use crate::chat::TemplateSource;
use crate::generate::{FinishReason, TokenOut};
use crate::tools::stream::{Piece, ToolStream};

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
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = Response::new(Body::full(e.to_json()));
    *r.status_mut() = StatusCode::from_u16(e.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(s) = e.kind.retry_after_secs() {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn json_response(body: String) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    use tracing::Instrument;
    let span = tracing::info_span!("request", route = %req.uri().path(), model = %app.model_id);
    route(app, req).instrument(span).await
}

async fn route(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let allowed: &[Method] = match path.as_str() {
        "/health" | "/v1/models" | "/admin/stats" => &[Method::GET],
        "/v1/chat/completions" | "/v1/completions" | "/apply-template" | "/admin/drain" | "/admin/cache/flush" => {
            &[Method::POST]
        }
        _ => return error_response(&ApiError::new(ErrorKind::NotFound, format!("no route {path}"))),
    };
    if !allowed.contains(&method) {
        let mut r =
            error_response(&ApiError::new(ErrorKind::MethodNotAllowed, format!("{method} is not allowed on {path}")));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allowed[0].as_str()));
        return r;
    }
    match path.as_str() {
        "/health" => json_response(r#"{"status":"ok"}"#.into()),
        "/v1/models" => json_response(serde_json::to_string(&models(&app)).unwrap_or_default()),
        "/admin/stats" => json_response(
            serde_json::to_string(&app.stats.snapshot(&app.model_id, app.max_queue, app.engine.file_bytes, &app.cache))
                .unwrap_or_default(),
        ),
        "/admin/drain" => drain(&app, &req).await,
        "/admin/cache/flush" => flush(&app).await,
        "/apply-template" => apply_template(&app, req).await,
        "/v1/chat/completions" => generate(app.clone(), req, Route::Chat).await,
        _ => generate(app.clone(), req, Route::Completion).await,
    }
}

fn models(app: &App) -> ModelList {
    let d = &app.defaults;
    let template = app.engine.template.as_ref().map(|t| match t.source() {
        TemplateSource::Gguf => "gguf".to_owned(),
        TemplateSource::Builtin(n) => format!("builtin:{n}"),
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

/// Read the body (bounded) and parse it; every failure is a 4xx in our error shape.
async fn read_json<T: DeserializeOwned>(req: Request<Incoming>, limit: usize) -> Result<T, ApiError> {
    let too_big = || ApiError::new(ErrorKind::PayloadTooLarge, format!("the request body is over {limit} bytes"));
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_big());
    }
    let bytes = http_body_util::Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                too_big()
            } else {
                ApiError::new(ErrorKind::InvalidJson, format!("reading the body: {e}"))
            }
        })?
        .to_bytes();
    let mut de = serde_json::Deserializer::from_slice(&bytes);
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

async fn generate(app: Arc<App>, req: Request<Incoming>, route: Route) -> Response<Body> {
    app.stats.requests_total.fetch_add(1, Ordering::Relaxed);
    if app.stats.draining.load(Ordering::Relaxed) {
        return error_response(&ApiError::new(ErrorKind::EngineDraining, "the engine is draining; retry"));
    }
    let validated = match route {
        Route::Chat => match read_json(req, app.max_body_bytes).await {
            Ok(r) => requests::chat(&r, &app.engine, &app.defaults, app.ctx),
            Err(e) => Err(e),
        },
        Route::Completion => match read_json(req, app.max_body_bytes).await {
            Ok(r) => requests::completion(&r, &app.engine, &app.defaults, app.ctx),
            Err(e) => Err(e),
        },
    };
    let v = match validated {
        Ok(v) => v,
        Err(e) => {
            app.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
            return error_response(&e);
        }
    };
    let (events, rx) = mpsc::channel(64);
    let Validated { prompt, params, stream, include_usage, warnings, tools, rendered: _ } = v;
    if let Err(e) = app.worker.submit(Job { prompt, params, events }) {
        app.stats.requests_failed.fetch_add(1, Ordering::Relaxed);
        return error_response(&e);
    }
    let meta = Meta::new(route, &app.model_id);
    let mut r = if stream {
        stream_response(app, meta, rx, include_usage, tools)
    } else {
        whole_response(app, meta, rx, tools).await
    };
    for w in &warnings {
        r.headers_mut().append(header::WARNING, warning_header(w));
    }
    r
}

/// `Warning: 299 - "grammar not enforced: <reason>"` (RFC 7234's miscellaneous
/// persistent warning), the reason reduced to what a header may carry.
fn warning_header(reason: &str) -> HeaderValue {
    let words: Vec<String> = reason
        .split_whitespace()
        .map(|w| w.chars().filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\').collect())
        .filter(|w: &String| !w.is_empty())
        .collect();
    let clean: String = words.join(" ").chars().take(300).collect();
    HeaderValue::from_str(&format!("299 - \"grammar not enforced: {clean}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("299 - \"grammar not enforced\""))
}

/// `POST /apply-template` (as llama.cpp's server): the prompt a chat request renders
/// to, with the tool prompt and any unenforced-constraint instruction in it.
async fn apply_template(app: &App, req: Request<Incoming>) -> Response<Body> {
    let v = match read_json(req, app.max_body_bytes).await {
        Ok(r) => requests::chat(&r, &app.engine, &app.defaults, app.ctx),
        Err(e) => Err(e),
    };
    match v {
        Ok(v) => json_response(
            serde_json::json!({"prompt": v.rendered, "prompt_tokens": v.prompt.len(), "warnings": v.warnings})
                .to_string(),
        ),
        Err(e) => error_response(&e),
    }
}

async fn whole_response(
    app: Arc<App>,
    meta: Meta,
    mut rx: mpsc::Receiver<Event>,
    tools: Option<ToolOutput>,
) -> Response<Body> {
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
                let body = responses::final_body(&meta, text, &o, &lp, &app.engine.tokenizer, tools.as_ref());
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
    tools: Option<ToolOutput>,
) -> Response<Body> {
    let (tx, body) = Body::channel(16);
    tokio::spawn(async move {
        let tok = &app.engine.tokenizer;
        let mut offset = 0usize;
        let mut calls = tools.map(|t| ToolStream::new(t.format, t.enforced));
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
                Some(Event::Token(t)) if calls.is_some() => {
                    let pieces = calls.as_mut().map(|c| c.push(&t.text)).unwrap_or_default();
                    tool_frames(&meta, tok, pieces, Some(&t))
                }
                Some(Event::Token(t)) => {
                    let c = responses::chunk(&meta, ChunkKind::Text { text: &t.text, lp: Some(&t), offset }, tok);
                    offset += t.text.len();
                    vec![c]
                }
                Some(Event::Flush(t)) if calls.is_some() => {
                    let pieces = calls.as_mut().map(|c| c.push(&t)).unwrap_or_default();
                    tool_frames(&meta, tok, pieces, None)
                }
                Some(Event::Flush(t)) => {
                    vec![responses::chunk(&meta, ChunkKind::Text { text: &t, lp: None, offset }, tok)]
                }
                Some(Event::Done(o)) if o.finish == FinishReason::Cancelled => {
                    let _ = tx.send(responses::sse_error(&cut())).await;
                    return;
                }
                Some(Event::Done(o)) => {
                    let mut frames = match calls.as_mut() {
                        Some(c) => tool_frames(&meta, tok, c.finish(), None),
                        None => Vec::new(),
                    };
                    let made_calls = calls.as_ref().is_some_and(|c| c.calls() > 0);
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

/// The chunks of parsed tool-stream pieces; a token's logprobs ride on its content.
fn tool_frames(
    meta: &Meta,
    tok: &crate::tokenizer::Tokenizer,
    pieces: Vec<Piece>,
    lp: Option<&TokenOut>,
) -> Vec<bytes::Bytes> {
    let mut lp = lp;
    pieces
        .iter()
        .map(|p| match p {
            Piece::Content(text) => responses::chunk(meta, ChunkKind::Text { text, lp: lp.take(), offset: 0 }, tok),
            Piece::CallStart { index, name } => {
                responses::chunk(meta, ChunkKind::Call(responses::call_start(*index, name)), tok)
            }
            Piece::CallArgs { index, fragment } => {
                responses::chunk(meta, ChunkKind::Call(responses::call_args(*index, fragment)), tok)
            }
        })
        .collect()
}

/// `POST /admin/drain[?timeout_ms=N]`: stop admitting, wait for queued and running
/// requests up to the deadline, cut what remains.
async fn drain(app: &App, req: &Request<Incoming>) -> Response<Body> {
    let timeout = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("timeout_ms=")))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(app.default_drain, Duration::from_millis);
    let cancelled = drain_now(app, timeout).await;
    let demotions = demote_all(app).await;
    json_response(serde_json::to_string(&DrainResponse { drained: true, demotions, cancelled }).unwrap_or_default())
}

/// Move every prompt-cache entry to the SSD tier (after a drain); returns how many are
/// now on disk.
pub async fn demote_all(app: &App) -> usize {
    let cache = app.cache.clone();
    let report = tokio::task::spawn_blocking(move || cache.flush(true)).await;
    report.map_or(0, |r| {
        tracing::info!(written = r.written, durable = r.durable, failed = r.failed, "prompt cache demoted");
        r.durable
    })
}

/// `POST /admin/cache/flush`: make every RAM entry durable on disk; entries stay in RAM.
async fn flush(app: &App) -> Response<Body> {
    let cache = app.cache.clone();
    match tokio::task::spawn_blocking(move || cache.flush(false)).await {
        Ok(r) => json_response(serde_json::to_string(&r).unwrap_or_default()),
        Err(e) => error_response(&ApiError::new(ErrorKind::Internal, format!("flush failed: {e}"))),
    }
}

/// Stop admitting work and wait (up to `timeout`) for the queue and the running request;
/// returns how many had to be cut.
pub async fn drain_now(app: &App, timeout: Duration) -> usize {
    app.stats.draining.store(true, Ordering::Relaxed);
    let busy = |s: &Stats| s.queue_depth.load(Ordering::Relaxed) + s.in_flight.load(Ordering::Relaxed);
    let deadline = Instant::now() + timeout;
    while busy(&app.stats) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = busy(&app.stats);
    if left > 0 {
        tracing::warn!(left, "drain deadline: cancelling remaining requests");
        app.worker.cancel_all.store(true, Ordering::Relaxed);
        let cut_deadline = Instant::now() + Duration::from_secs(5);
        while busy(&app.stats) > 0 && Instant::now() < cut_deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    left
}
